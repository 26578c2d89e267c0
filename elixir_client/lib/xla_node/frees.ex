defmodule XlaNode.Frees do
  @delay_ms 1
  @most_pending 256
  @remembered 1024

  @moduledoc false

  # Frees that cost no message of their own: `XlaNode.free_later/1`.
  #
  # A free noted here leaves with the process's next request to a node (`XlaNode.free_all/1`, or
  # any call this client makes), as one `{:free, refs}` cast to each node holding some, sent just
  # before it, so that the node frees it in order with the requests around it. Freeing a training
  # step's old params one tensor at a time (`Nx.backend_deallocate/1` does) then costs the step
  # one message, not one per tensor.
  #
  # A process that sends nothing more soon does not keep them: the first free a process notes
  # after sending its last ones asks this server to send them 1 ms later (@delay_ms), if the
  # process has not by then (a loop freeing a container's tensors takes far less); so do
  # 256 frees noted (@most_pending) without a request between, and the exit of the process.
  #
  # The notes live in a public ETS table keyed by the noting process, so that this server can send
  # a process's frees for it, even once it is gone. Either side takes a process's notes with one
  # `:ets.take/2`, so each free is sent once (and a free the node gets twice is skipped anyway).
  # Each process also remembers the last 1024 references (@remembered) it noted, to say
  # `:already_noted` for those. Without this server (the client's application not started), a free
  # is sent at once.

  use GenServer

  @table __MODULE__
  @pending {__MODULE__, :pending}
  @recent {__MODULE__, :recent}

  @doc false
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Notes `ref` (a buffer or executable of a node) to be freed with this process's next request;
  `:already_noted` when this process noted it already (among its last #{@remembered}).
  """
  @spec note(reference()) :: :ok | :already_noted
  def note(ref) when is_reference(ref) do
    cond do
      remembered?(ref) ->
        :already_noted

      :ets.whereis(@table) == :undefined ->
        XlaNode.free_all([ref])

      true ->
        # The first since this process's notes last left (whoever sent them).
        first? = not :ets.member(@table, self())
        :ets.insert(@table, {self(), ref})
        count = if first?, do: 1, else: Process.get(@pending, 0) + 1

        cond do
          first? ->
            GenServer.cast(__MODULE__, {:noted, self()})
            Process.put(@pending, 1)

          count >= @most_pending ->
            send_noted()

          true ->
            Process.put(@pending, count)
        end

        :ok
    end
  end

  # The last references this process noted: a set, and their order to forget the oldest.
  defp remembered?(ref) do
    {set, order} = Process.get(@recent, {MapSet.new(), :queue.new()})

    if MapSet.member?(set, ref) do
      true
    else
      {set, order} =
        if MapSet.size(set) < @remembered do
          {set, order}
        else
          {{:value, oldest}, order} = :queue.out(order)
          {MapSet.delete(set, oldest), order}
        end

      Process.put(@recent, {MapSet.put(set, ref), :queue.in(ref, order)})
      false
    end
  end

  @doc "Takes this process's noted frees (to send them with a request): their references."
  @spec take() :: [reference()]
  def take do
    case Process.delete(@pending) do
      nil -> []
      _count -> take(self())
    end
  end

  @doc "Sends this process's noted frees now, if any."
  @spec send_noted() :: :ok
  def send_noted, do: cast_frees(take())

  defp take(pid) do
    if :ets.whereis(@table) == :undefined,
      do: [],
      else: @table |> :ets.take(pid) |> Enum.map(fn {_pid, ref} -> ref end)
  end

  @doc """
  Sends `refs` (executables' and buffers' references) with one `{:free, refs}` cast to each node
  holding some, and tells `XlaNode.Keeper` they are freed; `:ok`.
  """
  @spec cast_frees([reference()]) :: :ok
  def cast_frees(refs) do
    refs
    |> Enum.group_by(&node/1)
    |> Enum.each(fn {node, refs} -> GenServer.cast({:xla, node}, {:free, refs}) end)

    XlaNode.Keeper.freed(refs)
  end

  @impl true
  def init(_opts) do
    :ets.new(@table, [:duplicate_bag, :public, :named_table, write_concurrency: true])
    {:ok, %{monitored: MapSet.new()}}
  end

  @impl true
  def handle_cast({:noted, pid}, state) do
    Process.send_after(self(), {:send, pid}, @delay_ms)

    if MapSet.member?(state.monitored, pid) do
      {:noreply, state}
    else
      Process.monitor(pid)
      {:noreply, %{state | monitored: MapSet.put(state.monitored, pid)}}
    end
  end

  @impl true
  def handle_info({:send, pid}, state) do
    pid |> take() |> cast_frees()
    {:noreply, state}
  end

  def handle_info({:DOWN, _ref, :process, pid, _reason}, state) do
    pid |> take() |> cast_frees()
    {:noreply, %{state | monitored: MapSet.delete(state.monitored, pid)}}
  end
end
