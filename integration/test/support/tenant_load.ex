defmodule XlaNode.TenantLoad do
  @moduledoc """
  Clients on peer nodes for `XlaNode.TenantsTest`: runs sent from a peer (so that the peer's node
  is their tenant), each on a process of its own that reports its answer, and a process that
  holds buffers on the peer and makes requests on command. Runs here call back to a process the
  test names, which holds each run on its callback until the test answers it: the order in which
  callbacks arrive is the order in which the node admitted the runs.
  """

  @doc """
  `{tag, seq}` as the run's argument, an f32[4] `[tag, seq, 0, 0]`: what the callback server
  sees of the run.
  """
  def arg(tag, seq) do
    {<<tag * 1.0::float-32-little, seq * 1.0::float-32-little, 0::64>>, {{:f, 32}, [4]}}
  end

  @doc "The `{tag, seq}` of a run's argument binary (see `arg/2`)."
  def tag_of(<<tag::float-32-little, seq::float-32-little, _::binary>>),
    do: {trunc(tag), trunc(seq)}

  @doc """
  Sends one run of `exe` per `seq` in `seqs` from this node, each from a process of its own,
  with argument `arg(tag, seq)` and run options `opts`, as a raw `GenServer.call`; each process
  reports `{:answered, {tag, seq}, reply}` to `report_to` once answered. Returns once all are
  sent, one after another: their arrival order is the order given.
  """
  def submit(node, exe, tag, seqs, opts, report_to) do
    send_runs(tag, seqs, report_to, fn x ->
      GenServer.call({:xla, node}, {:run, exe, [x], opts}, :infinity)
    end)
  end

  @doc """
  The same through the client library: `XlaNode.run/4` with `opts`, reporting
  `{:answered, {tag, seq}, result}`.
  """
  def submit_with_client(node, exe, tag, seqs, opts, report_to) do
    send_runs(tag, seqs, report_to, &XlaNode.run(node, exe, [&1], opts))
  end

  defp send_runs(tag, seqs, report_to, run) do
    parent = self()

    for seq <- seqs do
      spawn(fn ->
        send(parent, {:sending, seq})
        send(report_to, {:answered, {tag, seq}, run.(arg(tag, seq))})
      end)

      receive do
        {:sending, ^seq} -> Process.sleep(1)
      end
    end

    :ok
  end

  @doc """
  A process of this node that makes `GenServer.call({:xla, node}, request)` for whoever sends
  it `{:call, from, request}`, answering `{:reply, reply}`: the owner of the buffers it asks
  for, which live as long as it does.
  """
  def holder(node) do
    spawn(fn -> hold(node) end)
  end

  defp hold(node) do
    receive do
      {:call, from, request} ->
        send(from, {:reply, GenServer.call({:xla, node}, request, 30_000)})
        hold(node)
    end
  end

  @doc "Asks `holder` (see `holder/1`) to make `request`; its reply."
  def ask(holder, request) do
    send(holder, {:call, self(), request})

    receive do
      {:reply, reply} -> reply
    after
      30_000 -> {:error, :no_reply}
    end
  end
end
