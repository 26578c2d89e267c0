defmodule XlaNode.Compiler.Cache do
  @moduledoc """
  Compiled programs, per (function, argument templates, node), so that calling a jitted function
  again lowers and compiles nothing, and what the compiler needs to know of each node.

  The node frees an executable when the process that compiled it exits, so this process
  compiles them itself and lives as long as the application. Entries of a node go when the
  connection to it does (the node may have restarted without them).
  """
  use GenServer

  @table __MODULE__

  def start_link(_opts), do: GenServer.start_link(__MODULE__, nil, name: __MODULE__)

  @doc "The entry for `key`, or `nil`."
  def get(key) do
    case :ets.lookup(@table, key) do
      [{^key, entry}] -> entry
      [] -> nil
    end
  end

  @doc """
  What the compiler needs to know of `node`: `%{platform: platform, host_callbacks: boolean}`,
  asked once per connection.
  """
  def node_info(node), do: get({:node_info, node}) || fetch_node_info(node)

  defp fetch_node_info(node) do
    case XlaNode.info(node) do
      {:ok, %{platform: _, host_callbacks: _} = info} ->
        info = Map.take(info, [:platform, :host_callbacks])
        :ets.insert(@table, {{:node_info, node}, info})
        info

      {:error, error} ->
        raise error
    end
  end

  @doc """
  Compiles `text` on `node` and stores `%{exe: exe}` merged with `extra` under `key`; returns
  the entry, or raises the compile error. `compile_opts` go to `XlaNode.compile/3`.
  """
  def compile!(key, node, text, extra, compile_opts \\ []) do
    case GenServer.call(__MODULE__, {:compile, key, node, text, extra, compile_opts}, :infinity) do
      {:ok, entry} -> entry
      {:error, error} -> raise with_line(error, text)
    end
  end

  # XLA names the line of the program text it could not take ("-:13:77: error: ..."): the
  # message gets that line of the generated text.
  defp with_line(%XlaNode.Error{kind: :compile_error, message: message} = error, text) do
    with [_, line] <- Regex.run(~r/^-:(\d+):/, message),
         {:ok, source} <- Enum.fetch(String.split(text, "\n"), String.to_integer(line) - 1) do
      %{
        error
        | message: message <> "\nin the generated program, line #{line}:\n" <> String.trim(source)
      }
    else
      _ -> error
    end
  end

  defp with_line(error, _text), do: error

  @impl true
  def init(nil) do
    :ets.new(@table, [:named_table, :public, read_concurrency: true])
    :ok = :net_kernel.monitor_nodes(true)
    {:ok, nil}
  end

  @impl true
  def handle_call({:compile, key, node, text, extra, compile_opts}, _from, state) do
    reply =
      with {:ok, exe} <- XlaNode.compile(node, text, compile_opts) do
        entry = Map.put(extra, :exe, exe)
        :ets.insert(@table, {key, entry})
        {:ok, entry}
      end

    {:reply, reply, state}
  end

  @impl true
  def handle_info({:nodedown, node}, state) do
    :ets.match_delete(@table, {{:_, :_, node}, :_})
    :ets.delete(@table, {:node_info, node})
    {:noreply, state}
  end

  def handle_info({:nodeup, _node}, state), do: {:noreply, state}
end
