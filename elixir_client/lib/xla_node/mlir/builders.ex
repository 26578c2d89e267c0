defmodule XlaNode.MLIR.Builders do
  @moduledoc false
  # Where each process stands in building with XlaNode.MLIR: the module its `module/1` call is
  # building and the function, if any, whose body is running. The state of the build lives in
  # that module and function (XlaNode.MLIR.Module, XlaNode.MLIR.Function), which values and
  # functions carry; this says only where a process is, for what no value can tell: the
  # function of an op without operands (a constant, an iota) or of a region's block arguments,
  # the module `function/4` adds to, and which error an op outside its function raises.
  #
  # A public ETS table keyed by pid, which a process of its own keeps for the life of the VM:
  # a process building a module may end at any time, and the table must outlive it. A process
  # killed while it builds leaves its row behind; the keeper drops such rows now and then.

  @table __MODULE__
  @sweep_every :timer.minutes(1)

  @doc """
  Notes that the calling process builds `module`; raises `ArgumentError` if it builds one
  already.
  """
  def open_module!(module) do
    unless :ets.insert_new(table(), {self(), module, nil}),
      do: raise(ArgumentError, "XlaNode.MLIR.module/1 calls cannot nest")

    :ok
  end

  @doc "Notes that the calling process builds no module any more."
  def close_module do
    :ets.delete(@table, self())
    :ok
  end

  @doc "The module and the function (or `nil`) the calling process builds; `nil` if none."
  def where do
    case lookup(self()) do
      [{_pid, module, function}] -> {module, function}
      [] -> nil
    end
  end

  @doc "The function whose body the calling process runs, or `nil`."
  def function do
    :ets.lookup_element(@table, self(), 3)
  rescue
    # No row: the process builds no module (or no process has built one yet).
    ArgumentError -> nil
  end

  @doc "Notes the function whose body the calling process runs (`nil` when it ends)."
  def put_function(function) do
    :ets.update_element(@table, self(), {3, function})
    :ok
  end

  defp lookup(pid) do
    :ets.lookup(@table, pid)
  rescue
    # No process has built a module yet.
    ArgumentError -> []
  end

  defp table do
    if :ets.whereis(@table) == :undefined, do: start_keeper()
    @table
  end

  # The table's owner: a process that only keeps it. Two processes may start one at once; the
  # one that does not create the table ends.
  defp start_keeper do
    caller = self()

    {keeper, monitor} =
      spawn_monitor(fn ->
        try do
          :ets.new(@table, [
            :named_table,
            :public,
            read_concurrency: true,
            write_concurrency: true
          ])
        rescue
          # Another keeper created it first.
          ArgumentError -> exit(:normal)
        end

        send(caller, {@table, self()})
        keep()
      end)

    receive do
      {@table, ^keeper} -> Process.demonitor(monitor, [:flush])
      {:DOWN, ^monitor, :process, ^keeper, _already_created} -> :ok
    end
  end

  defp keep do
    Process.sleep(@sweep_every)

    for {pid, _module, _function} <- :ets.tab2list(@table),
        not Process.alive?(pid),
        do: :ets.delete(@table, pid)

    keep()
  end
end
