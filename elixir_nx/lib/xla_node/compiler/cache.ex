defmodule XlaNode.Compiler.Cache do
  @moduledoc false

  # Compiled programs, per (function, arguments' structure, node) as `XlaNode.Compiler.Program`
  # keys them, so that calling a jitted function again lowers and compiles nothing, and what the
  # compiler needs to know of each node.
  #
  # The node frees an executable when the process that compiled it exits, so this process
  # compiles them itself and lives as long as the application. Entries of a node go when the
  # connection to it does (the node may have restarted without them).
  #
  # Keys and entries cross into this process and into ETS, copies that do not keep a term's
  # sharing: an entry holds the executable, output templates and the callbacks, and a key the
  # traced function with any expression it captured replaced by its id
  # (`XlaNode.Compiler.Program.function_key/1`), never an expression graph.
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
  the entry, or raises the compile error. `compile_opts` go to `XlaNode.compile/3`, but for
  `describe: true`, which adds the node's `XlaNode.describe/3` of the executable to the entry
  as `:description` (an SPMD program's result shapes are the partitioner's choice). Callers
  asking for the same key while it compiles wait for that one compile; other keys compile at the
  same time.
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
    # Owners are linked: when this process stops, they stop and their programs are freed.
    Process.flag(:trap_exit, true)
    # node_type: :all, or the hidden compute nodes' disconnections would never be seen.
    :ok = :net_kernel.monitor_nodes(true, node_type: :all)
    {:ok, %{compiling: %{}}}
  end

  # Each program is compiled by a process of its own, which then holds it (the node frees an
  # executable when the process that compiled it exits): a long compile, or a node that does not
  # answer, keeps no other caller waiting. `compiling` maps an owner still compiling to its key,
  # extra and waiting callers; an owner that holds an entry has an `{:owner, pid}` row in the table.
  @impl true
  def handle_call({:compile, key, node, text, extra, compile_opts}, from, state) do
    case get(key) || Enum.find(state.compiling, fn {_, {k, _, _, _}} -> k == key end) do
      nil ->
        cache = self()
        owner = spawn_link(fn -> own(cache, node, text, compile_opts) end)
        {:noreply, put_in(state.compiling[owner], {key, node, extra, [from]})}

      {owner, {key, node, extra, waiting}} ->
        {:noreply, put_in(state.compiling[owner], {key, node, extra, [from | waiting]})}

      entry ->
        {:reply, {:ok, entry}, state}
    end
  end

  @impl true
  def handle_info({:compiled, owner, result}, state) do
    {{key, node, extra, waiting}, compiling} = Map.pop(state.compiling, owner)

    reply =
      with {:ok, compiled} <- result do
        entry = Map.merge(extra, compiled)
        :ets.insert(@table, [{key, entry}, {{:owner, owner}, key, node}])
        {:ok, entry}
      end

    Enum.each(waiting, &GenServer.reply(&1, reply))
    {:noreply, %{state | compiling: compiling}}
  end

  # An owner that stops takes its entry with it; one that stops while compiling fails its callers.
  def handle_info({:EXIT, owner, reason}, state) do
    for {_, key, _node} <- :ets.take(@table, {:owner, owner}), do: :ets.delete(@table, key)

    case Map.pop(state.compiling, owner) do
      {nil, _} ->
        {:noreply, state}

      {{_key, _node, _extra, waiting}, compiling} ->
        error = %XlaNode.Error{kind: :exit, message: "the compile stopped: #{inspect(reason)}"}
        Enum.each(waiting, &GenServer.reply(&1, {:error, error}))
        {:noreply, %{state | compiling: compiling}}
    end
  end

  # The node's programs are gone with it: entries and owners go now, before any compile for the
  # node that comes back.
  def handle_info({:nodedown, node, _info}, state) do
    for [owner] <- :ets.match(@table, {{:owner, :"$1"}, :_, node}) do
      :ets.delete(@table, {:owner, owner})
      send(owner, :drop)
    end

    :ets.match_delete(@table, {{:_, :_, node}, :_})
    :ets.delete(@table, {:node_info, node})
    {:noreply, state}
  end

  def handle_info({:nodeup, _node, _info}, state), do: {:noreply, state}

  defp described(node, exe) do
    case XlaNode.describe(node, exe) do
      {:ok, description} -> {:ok, %{exe: exe, description: description}}
      {:error, _} = error -> error
    end
  end

  # A program's owner: compiles it, reports, and holds it until its node goes.
  defp own(cache, node, text, compile_opts) do
    {describe?, compile_opts} = Keyword.pop(compile_opts, :describe, false)

    result =
      with {:ok, exe} <- XlaNode.compile(node, text, compile_opts) do
        if describe?, do: described(node, exe), else: {:ok, %{exe: exe}}
      end

    send(cache, {:compiled, self(), result})

    with {:ok, _compiled} <- result do
      receive do
        :drop -> :ok
      end
    end
  end
end
