defmodule XlaNode.MLIR.Builders do
  @moduledoc false
  # Where each process stands in building with XlaNode.MLIR: the module its `module/1` call is
  # building and the function, if any, whose body is running. The state of the build lives in
  # that module and function (XlaNode.MLIR.Module, XlaNode.MLIR.Function), which values and
  # functions carry; this says only where a process is, for what no value can tell: the
  # function of an op without operands (a constant, an iota) or of a region's block arguments,
  # the module `function/4` adds to, and which error an op outside its function raises.
  #
  # A public ETS table keyed by pid, kept by this server in the client's application (the
  # table must outlive any process building a module, which may end at any time). A process
  # killed while it builds leaves its row behind; the server drops such rows now and then.

  use GenServer

  @table __MODULE__
  @sweep_every :timer.minutes(1)

  @doc false
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

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

  # Where the application is not started yet (a script putting the client on its code path),
  # building starts it.
  defp table do
    if :ets.whereis(@table) == :undefined,
      do: {:ok, _} = Application.ensure_all_started(:xla_node_client)

    @table
  end

  @impl true
  def init(_opts) do
    :ets.new(@table, [:named_table, :public, read_concurrency: true, write_concurrency: true])
    Process.send_after(self(), :sweep, @sweep_every)
    {:ok, nil}
  end

  @impl true
  def handle_info(:sweep, state) do
    for {pid, _module, _function} <- :ets.tab2list(@table),
        not Process.alive?(pid),
        do: :ets.delete(@table, pid)

    Process.send_after(self(), :sweep, @sweep_every)
    {:noreply, state}
  end
end
