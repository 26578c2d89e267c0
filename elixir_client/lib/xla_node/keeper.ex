defmodule XlaNode.Keeper do
  @sizes 64
  @smallest 65
  @sweep_after 1024
  @min_interval_ms 20
  @idle_interval_ms 1_000
  @cpu_share 50

  @moduledoc """
  Buffers that live while a process holds them: the lifetime of an EXLA tensor (a NIF
  resource, freed once no process holds it and its holders' garbage is collected), for the
  buffers of any node, without a NIF. `XlaNode.Backend` keeps every tensor this way.

  A buffer kept here is held on its node by this process (made with `owner: XlaNode.Keeper.owner()`,
  see `XlaNode.run/4` and `XlaNode.to_device/3`), and `track/1` gives it a *token*: a binary of
  #{@smallest} to #{@smallest + @sizes - 1} bytes, off the process heaps and reference-counted by
  the runtime. Whoever holds the buffer also holds its token (`XlaNode.Backend` keeps it in
  the tensor). This process keeps one reference to every token and reads their reference
  counts with `:erlang.process_info(self(), :binary)`: every heap, mailbox and ETS table that
  holds a copy counts once, so a count of 1 means nobody else holds it any more, and its buffer
  is released: one `{:release, buffers, keeper}` cast per node and sweep.

  ## Tokens and their ids

  `process_info/2` names each binary by an id and gives its size, not its bytes. A token's id
  is learnt once, after it arrives here, by a short-lived process that holds nothing but up to
  #{@sizes} new tokens of distinct sizes: its own `process_info/2` lists each token once, and
  the size tells which is which. From then on a sweep reads the whole list once and looks up
  the ids whose count is 1.

  ## Sweeps

  A sweep runs #{@min_interval_ms} ms after the first token tracked since the last one, or at
  once when #{@sweep_after} tokens (or half the live ones, if more) were tracked since, so that
  a loop making tensors quickly frees them as quickly; while nothing changes it runs less and
  less often, down to once a second. Its cost grows with the live tokens (the list read is one
  entry a token), so the wait after a sweep is at least #{@cpu_share} times the sweep's own time:
  the keeper takes at most 1/#{@cpu_share} of a CPU. `sweep/1` runs one now.

  ## Across nodes

  Each BEAM node's keeper holds for its own processes. A token is `<<origin::64, serial::64,
  padding>>`: the keeper that made it and its number. A tensor that comes from another node (a
  new binary here, whose count the node of origin does not see) is taken over the first time
  this node's client uses it (`hold/2`, which `XlaNode.Backend` calls on every tensor it reads
  or runs with): this keeper shares the buffer on the compute node (`{:share, buffers,
  keeper}`) and tracks the token. The buffer goes once no node's keeper holds it. A client node
  that goes down releases what its keeper held (the compute node monitors the keeper).

  Tracking is by token, so two copies of one token that reached this node separately are one:
  when the copy taken over goes, the buffer is released here, and the other copy is taken over
  again at its next use, if another node still holds the buffer then.
  """

  use GenServer

  @table __MODULE__
  @identity {__MODULE__, :identity}

  @typedoc "A token: the binary whose holders keep a buffer alive."
  @type token :: binary()

  @doc false
  def start_link(opts), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  The process that holds the buffers kept here on their nodes: give it as `owner:` to
  `XlaNode.run/4` and `XlaNode.to_device/3`, then `track/1` the buffers. `nil` when the client's
  application is not started.
  """
  @spec owner() :: pid() | nil
  def owner do
    case :persistent_term.get(@identity, nil) do
      {keeper, _origin} -> keeper
      nil -> nil
    end
  end

  @doc """
  Tokens for `buffers`, which `owner/0` holds on their nodes (the buffer references name
  them): each buffer lives while its token is held by some process, and is released soon
  after the last holder drops it and is garbage-collected. `nil` when the keeper is not
  running.

      {:ok, buffer} = XlaNode.to_device(node, tensor, owner: XlaNode.Keeper.owner())
      [token] = XlaNode.Keeper.track([buffer])
      # keep {buffer, token} together, in any process; drop both when done
  """
  @spec track([reference()]) :: [token()] | nil
  def track([]), do: []

  def track(buffers) when is_list(buffers) do
    case :persistent_term.get(@identity, nil) do
      {keeper, origin} ->
        items = for buffer <- buffers, do: {token(origin), buffer}
        keys = for {token, _buffer} <- items, do: {key(token)}

        try do
          :ets.insert(@table, keys)
        rescue
          # The keeper restarted meanwhile: what it held is gone with it.
          ArgumentError -> nil
        else
          true ->
            send(keeper, {:track, items})
            Enum.map(items, &elem(&1, 0))
        end

      nil ->
        nil
    end
  end

  defp token(origin) do
    serial = :erlang.unique_integer([:positive])
    padding = @smallest - 16 + rem(serial, @sizes)
    <<origin::64, serial::64, 0::size(padding)-unit(8)>>
  end

  # Only the numbers: a sub-binary would hold the token.
  defp key(<<origin::64, serial::64, _::binary>>), do: {origin, serial}

  @doc """
  Makes sure this node's keeper holds `buffer` for the processes of this node, given the
  `token` that came with it: a no-op for a token this keeper tracks; for one made on another
  node (or before this keeper restarted, or whose tracking here ended), it shares the buffer on
  its node (`{:share, [buffer], keeper}`, a call: once this returns, the buffer stays while
  this node's processes hold the token, whatever the other nodes do; one round trip, the first
  time this node sees the token) and tracks this token. A buffer that is gone already stays
  gone: the next request that uses it says so. Raises `ArgumentError` for a binary that is not
  a token.
  """
  @spec hold(token(), reference()) :: :ok
  def hold(token, buffer) when is_binary(token) and is_reference(buffer) do
    unless token?(token) do
      raise ArgumentError,
            "not a token of XlaNode.Keeper (a binary of #{@smallest}..#{@smallest + @sizes - 1} " <>
              "bytes made by track/1), got: #{inspect(token, limit: 8)}"
    end

    with {keeper, _origin} <- :persistent_term.get(@identity, nil),
         true <- insert_new(key(token)) do
      send(keeper, {:track, [{token, buffer}]})
      share(buffer, keeper)
    end

    :ok
  end

  # An unknown buffer, or a node that is down, is the next request's to report.
  defp share(buffer, keeper) do
    GenServer.call({:xla, node(buffer)}, {:share, [buffer], keeper}, 60_000)
  catch
    :exit, _reason -> :ok
  end

  # Whether this process is the one to take the key over (false also when the table went with a
  # keeper that stopped: there is nothing to hold with).
  defp insert_new(key) do
    :ets.insert_new(@table, {key})
  rescue
    ArgumentError -> false
  end

  defp token?(token),
    do:
      byte_size(token) >= @smallest and byte_size(token) < @smallest + @sizes and
        match?(<<_::64, _::64, _::binary>>, token)

  @doc """
  Runs a sweep now and returns what it did: `released` (buffers released by this sweep), and
  `live` (tokens tracked after it). It returns once the nodes have taken the releases (a
  `:ping` after them), so that a request sent afterwards sees them done. A sweep sees only the
  tokens that their holders' heaps no longer hold: collect the garbage of a process that
  dropped some first (`:erlang.garbage_collect/1`) to have them released now.
  """
  @spec sweep(timeout()) :: %{released: non_neg_integer(), live: non_neg_integer()}
  def sweep(timeout \\ 60_000), do: GenServer.call(__MODULE__, :sweep, timeout)

  @doc """
  Tells the keeper that `refs` were freed on their nodes (`XlaNode.free_all/1` and the other
  frees do): their tokens are still tracked until their holders drop them, but no release is
  sent for them then. Costs one local message, none to a node.
  """
  @spec freed([reference()]) :: :ok
  def freed([]), do: :ok

  def freed(refs) when is_list(refs) do
    case owner() do
      nil -> :ok
      keeper -> send(keeper, {:freed, refs})
    end

    :ok
  end

  @doc """
  The keeper's figures: `live` (tokens tracked), `tracked` and `released` (since it started),
  `sweeps`, `last_sweep_us` (the last sweep's time) and `interval_ms` (the wait before the next
  timed one).
  """
  @spec stats(timeout()) :: map()
  def stats(timeout \\ 60_000), do: GenServer.call(__MODULE__, :stats, timeout)

  ## Server

  @impl true
  def init(_opts) do
    Process.flag(:trap_exit, true)

    :ets.new(@table, [
      :set,
      :public,
      :named_table,
      read_concurrency: true,
      write_concurrency: true
    ])

    origin = :rand.uniform(0xFFFFFFFFFFFFFFFF) - 1
    :persistent_term.put(@identity, {self(), origin})

    {:ok,
     %{
       # id => [{token, buffer}]: tokens whose id is known (several for copies that came from
       # another node in one message, sub-binaries of one binary).
       entries: %{},
       # Tokens whose id is known, and the ids that more than one has: id => how many.
       learnt: 0,
       shared_ids: %{},
       # {token, buffer} whose id is to be learnt, with their count.
       pending: [],
       pending_count: 0,
       # buffer => tokens tracked for it (a buffer is released when its last one goes).
       buffers: %{},
       # {origin, serial} => tokens tracked under it (copies taken over separately).
       keys: %{},
       # Tracked buffers freed on their nodes already: no release for them.
       freed: MapSet.new(),
       # The nodes released to since the last sweep/1 call, which confirms them.
       released_to: [],
       tracked_since: 0,
       timer: nil,
       # The wait before the timed sweep armed, and the shortest one the last sweep's time
       # allows.
       interval: @min_interval_ms,
       floor: @min_interval_ms,
       stats: %{tracked: 0, released: 0, sweeps: 0, last_sweep_us: 0}
     }}
  end

  @impl true
  def handle_call(:sweep, _from, state) do
    {released, state} = sweep_now(state)
    # The :xla server takes a process's messages in order: the releases are done once it
    # answers.
    for node <- state.released_to, do: XlaNode.ping(node, timeout: 5_000)
    {:reply, %{released: released, live: live(state)}, %{state | released_to: []}}
  end

  def handle_call(:stats, _from, state) do
    stats = Map.merge(state.stats, %{live: live(state), interval_ms: state.interval})
    {:reply, stats, state}
  end

  @impl true
  def handle_info({:track, items}, state) do
    state = Enum.reduce(items, state, &count_in/2)
    n = length(items)

    state = %{
      state
      | pending: items ++ state.pending,
        pending_count: state.pending_count + n,
        tracked_since: state.tracked_since + n,
        stats: Map.update!(state.stats, :tracked, &(&1 + n))
    }

    if state.tracked_since >= max(@sweep_after, div(live(state), 2)) do
      {_released, state} = sweep_now(state)
      {:noreply, state}
    else
      {:noreply, arm_soon(state)}
    end
  end

  def handle_info({:freed, refs}, state) do
    freed = for ref <- refs, Map.has_key?(state.buffers, ref), into: state.freed, do: ref
    {:noreply, %{state | freed: freed}}
  end

  def handle_info(:sweep, state) do
    {_released, state} = sweep_now(%{state | timer: nil})
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, _state) do
    :persistent_term.erase(@identity)
    :ok
  end

  defp live(state), do: state.learnt + state.pending_count

  defp count_in({token, buffer}, state) do
    %{
      state
      | buffers: Map.update(state.buffers, buffer, 1, &(&1 + 1)),
        keys: Map.update(state.keys, key(token), 1, &(&1 + 1))
    }
  end

  defp arm(state, ms),
    do: %{state | timer: Process.send_after(self(), :sweep, ms), interval: ms}

  # Tokens come in: a timed sweep as soon as the last sweep's time allows, not after an idle
  # wait.
  defp arm_soon(%{timer: nil} = state), do: arm(state, state.floor)

  defp arm_soon(%{interval: interval, floor: floor} = state) when interval > floor do
    Process.cancel_timer(state.timer)
    arm(state, floor)
  end

  defp arm_soon(state), do: state

  defp sweep_now(state) do
    if state.timer, do: Process.cancel_timer(state.timer)
    started = System.monotonic_time(:microsecond)
    state = learn(%{state | timer: nil})
    {:binary, binaries} = :erlang.process_info(self(), :binary)
    {gone, state} = take_unheld(binaries, state)
    state = release(gone, state)
    took = System.monotonic_time(:microsecond) - started
    changed? = gone != [] or state.tracked_since > 0

    stats = %{
      state.stats
      | released: state.stats.released + length(gone),
        sweeps: state.stats.sweeps + 1,
        last_sweep_us: took
    }

    floor = max(@min_interval_ms, div(took * @cpu_share, 1000))
    state = %{state | tracked_since: 0, stats: stats, floor: floor}
    state = if live(state) > 0, do: arm(state, next_interval(state, changed?)), else: state
    {length(gone), state}
  end

  # The tokens nobody but this process holds, taken out of `entries`: those of ids whose
  # count is the number of times this process's list names them (once, for most tokens: a
  # count of 1).
  defp take_unheld(binaries, state) do
    %{entries: entries, shared_ids: shared_ids} = state

    {unheld, seen} =
      Enum.reduce(binaries, {[], %{}}, fn
        {id, _size, 1}, {unheld, seen} = acc ->
          if Map.has_key?(entries, id), do: {[id | unheld], seen}, else: acc

        {id, _size, count}, {unheld, seen} = acc ->
          if Map.has_key?(shared_ids, id),
            do: {unheld, Map.update(seen, id, {1, count}, fn {n, c} -> {n + 1, c} end)},
            else: acc
      end)

    unheld = unheld ++ for {id, {times, count}} <- seen, times == count, do: id
    {gone, entries} = Map.split(entries, unheld)
    gone = gone |> Map.values() |> List.flatten()

    {gone,
     %{
       state
       | entries: entries,
         shared_ids: Map.drop(shared_ids, unheld),
         learnt: state.learnt - length(gone)
     }}
  end

  # Soon while tokens come and go, less often while nothing changes; never more than a
  # 1/@cpu_share of a CPU.
  defp next_interval(state, true = _changed?), do: state.floor

  defp next_interval(state, false),
    do: max(state.floor, min(state.interval * 2, @idle_interval_ms))

  # Ends the tracking of `gone` ({token, buffer}, whose count was 1): a buffer whose last token
  # went is released on its node, a key whose last token went leaves the table.
  defp release(gone, state) do
    {buffers, keys, released} =
      Enum.reduce(gone, {state.buffers, state.keys, []}, fn {token, buffer},
                                                            {buffers, keys, released} ->
        {buffers, last_buffer?} = count_out(buffers, buffer)
        {keys, last_key?} = count_out(keys, key(token))
        if last_key?, do: :ets.delete(@table, key(token))
        {buffers, keys, if(last_buffer?, do: [buffer | released], else: released)}
      end)

    {freed, released} = Enum.split_with(released, &MapSet.member?(state.freed, &1))
    by_node = Enum.group_by(released, &node/1)
    for {node, refs} <- by_node, do: GenServer.cast({:xla, node}, {:release, refs, self()})

    %{
      state
      | buffers: buffers,
        keys: keys,
        freed: MapSet.difference(state.freed, MapSet.new(freed)),
        released_to: Enum.uniq(Map.keys(by_node) ++ state.released_to)
    }
  end

  defp count_out(counts, key) do
    case Map.fetch!(counts, key) do
      1 -> {Map.delete(counts, key), true}
      n -> {Map.put(counts, key, n - 1), false}
    end
  end

  # The ids of the pending tokens, learnt by probes: each takes up to @sizes tokens of distinct
  # sizes. A probe that fails leaves its tokens pending for the next sweep. The id and the size
  # are those of the binary a token refers to: a token made here is one, a token that came from
  # another node is part of the binary of the message it came in.
  defp learn(%{pending: []} = state), do: state

  defp learn(state) do
    {entries, learnt, left} =
      state.pending
      |> Enum.group_by(fn {token, _buffer} -> :binary.referenced_byte_size(token) end)
      |> Map.values()
      |> rounds([])
      |> Enum.reduce({state.entries, [], []}, fn group, {entries, learnt, left} ->
        case probe(group) do
          {:ok, ids} ->
            Enum.reduce(group, {entries, learnt, left}, fn {token, _} = item, {e, l, left} ->
              id = Map.fetch!(ids, :binary.referenced_byte_size(token))
              {Map.update(e, id, [item], &[item | &1]), [id | l], left}
            end)

          :error ->
            {entries, learnt, group ++ left}
        end
      end)

    shared_ids =
      Enum.reduce(learnt, state.shared_ids, fn id, shared ->
        case Map.fetch!(entries, id) do
          [_one] -> shared
          items -> Map.put(shared, id, length(items))
        end
      end)

    %{
      state
      | entries: entries,
        shared_ids: shared_ids,
        learnt: state.learnt + length(learnt),
        pending: left,
        pending_count: length(left)
    }
  end

  # Groups of items with distinct sizes: one of each size per round.
  defp rounds(by_size, acc) do
    case Enum.reject(by_size, &(&1 == [])) do
      [] ->
        acc

      left ->
        rounds(Enum.map(left, &tl/1), [Enum.map(left, &hd/1) | acc])
    end
  end

  # A process holding only the group's tokens lists each once: size => id.
  defp probe(group) do
    tokens = Enum.map(group, &elem(&1, 0))

    {_pid, monitor} =
      spawn_monitor(fn ->
        {:binary, binaries} = :erlang.process_info(self(), :binary)
        ids = for {id, size, _count} <- binaries, do: {size, id}
        # The tokens are held until after the list is read.
        exit({:probed, ids, length(tokens)})
      end)

    receive do
      {:DOWN, ^monitor, :process, _pid, {:probed, ids, _}} ->
        by_size = Map.new(ids)

        if map_size(by_size) == length(ids) and
             Enum.all?(tokens, &Map.has_key?(by_size, :binary.referenced_byte_size(&1))),
           do: {:ok, by_size},
           else: :error

      {:DOWN, ^monitor, :process, _pid, _reason} ->
        :error
    end
  end
end
