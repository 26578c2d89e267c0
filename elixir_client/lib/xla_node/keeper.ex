defmodule XlaNode.Keeper do
  @sizes 64
  @smallest 65
  @sweep_after 1024
  @min_interval_ms 20
  @idle_interval_ms 1_000
  @cpu_share 50
  @freed_sweeps 16
  @drain 10_000

  @moduledoc """
  Buffers that live while a process holds them: the lifetime of an EXLA tensor (a NIF
  resource, freed once no process holds it and its holders' garbage is collected), for the
  buffers of any node, without a NIF. `XlaNode.Backend` keeps every tensor this way.

  A buffer kept here is held on its node by this process (made with `owner:
  XlaNode.Keeper.owner()`, see `XlaNode.run/4` and `XlaNode.to_device/3`), and `track/1` gives
  it a *token*: a binary of #{@smallest} to #{@smallest + @sizes - 1} bytes, off the process
  heaps and reference-counted by the runtime. Whoever holds the buffer holds its token too
  (`XlaNode.Backend` keeps it in the tensor). This process keeps one reference to every token
  and reads their reference counts with `:erlang.process_info(self(), :binary)`: every heap,
  mailbox and ETS table that holds a copy counts once, so a count of 1 means that nobody else
  holds it any more, and this process's hold on the buffer ends: one `{:release, buffers,
  keeper}` cast per node and sweep. A process's dropped tokens count until its garbage is
  collected, as a dropped EXLA tensor does.

  ## Tokens and their ids

  `process_info/2` names each binary by an id (its address) and gives its size, not its
  bytes. A token's id is learnt once, when a sweep finds it new, by a short-lived process that
  holds nothing but up to #{@sizes} new tokens of distinct sizes: its own `process_info/2` lists
  each once, and the size tells which is which. From then on a sweep reads its own list once
  and takes the tokens whose count is 1 out of a map by id.

  ## Sweeps

  A sweep runs #{@min_interval_ms} ms after the first token tracked since the last one, or at
  once when #{@sweep_after} tokens (or as many as the last sweep left, if more) were tracked
  since, so that a loop making tensors quickly frees them as quickly, at a cost per tensor made
  of about two entries of the list a sweep reads; while nothing changes it runs less and less often, down to once a second. Its
  cost grows with the live tokens (one entry each), so the wait after a sweep is at least
  #{@cpu_share} times the sweep's own time: timed sweeps take at most 1/#{@cpu_share} of a CPU.
  `sweep/1` runs one now. `bench/lifetime.exs` measures these costs.

  ## Across nodes

  Each BEAM node's keeper holds for its own processes. A token is `<<origin::64, serial::64,
  padding>>`: the keeper that made it and its number. A token that came from another node is
  a new binary here (part of the binary of the message it came in), whose count the node of
  origin does not see: it is taken over the first time this node's client uses it (`hold/2`,
  which `XlaNode.Backend` calls on every tensor it reads or runs with), and this keeper then
  takes a hold of its own on the buffer (`{:share, buffers, keeper}`, before the use goes on).
  Holds are counted on the compute node: the buffer goes once no keeper of any node holds it.
  A client node that goes down releases what its keeper held (the compute node monitors the
  keeper).

  A token made here that went through `:erlang.term_to_binary/1` and back is a binary of its
  own again, taken for the one made here: it is not held by itself.

  Until its first use there, a tensor on another node is held only by the node it came from
  (nothing in Erlang runs when a message arrives): a tensor sent to another node and dropped
  here at once is gone there if it was not used there first. `hand_over/3`, before the
  message goes, closes that gap: the receiving node's keeper holds the buffer from then until
  one of its processes first uses it, or until the process it was handed to exits. Copies of
  one token that reached a node separately are tracked there as one, the first used: when it
  goes, the others are taken over again at their next use, if another node still holds the
  buffer then.
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

      tensor = XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32})
      {:ok, buffer} = XlaNode.to_device(:"xla@host", tensor, owner: XlaNode.Keeper.owner())
      [token] = XlaNode.Keeper.track([buffer])
      # Keep {buffer, token} together, in any process; drop both when done.
      is_binary(token)
      #=> true
  """
  @spec track([reference()]) :: [token()] | nil
  def track([]), do: []

  def track(buffers) when is_list(buffers) do
    case :persistent_term.get(@identity, nil) do
      {keeper, origin} ->
        items = for buffer <- buffers, do: {token(origin), buffer}
        send(keeper, {:track, items})
        Enum.map(items, &elem(&1, 0))

      nil ->
        nil
    end
  end

  # Its size spread over the @sizes sizes (unique integers advance by a stride of several).
  defp token(origin) do
    serial = :erlang.unique_integer([:positive])
    padding = @smallest - 16 + :erlang.phash2(serial, @sizes)
    <<origin::64, serial::64, 0::size(padding)-unit(8)>>
  end

  # Only the numbers: a sub-binary would hold the token.
  defp key(<<origin::64, serial::64, _::binary>>), do: {origin, serial}

  @doc """
  Makes sure this node's keeper holds `buffer` for the processes of this node, given the
  `token` that came with it: a no-op for a token made here (no lookup: such a token is a
  binary of its own), or taken over here already (one table lookup); for any other (made on
  another node, or here but come back from another node, or before this keeper restarted) it
  shares the buffer on its node (`{:share, [buffer], keeper}`, a call: once this returns, the
  buffer stays while this node's processes hold the token, whatever the other nodes do; one
  round trip, the first time this node sees the token) and tracks this token; a buffer handed
  over to this node (`hand_over/3`) and not used here yet is taken over the same way, and the
  hand-over's hold ends. A buffer that is gone already stays gone: the next request that uses
  it says so. Raises `ArgumentError` for a binary that is not a token.
  """
  @spec hold(token(), reference()) :: :ok
  def hold(token, buffer) when is_binary(token) and is_reference(buffer) do
    unless token?(token) do
      raise ArgumentError,
            "not a token of XlaNode.Keeper (a binary of #{@smallest}..#{@smallest + @sizes - 1} " <>
              "bytes made by track/1), got: #{inspect(token, limit: 8)}"
    end

    case :persistent_term.get(@identity, nil) do
      {keeper, origin} -> hold(token, buffer, keeper, origin)
      nil -> :ok
    end
  end

  defp hold(token, buffer, keeper, origin) do
    unless made_here?(token, origin) do
      case take_over(key(token)) do
        :new ->
          send(keeper, {:track, [{token, buffer, :adopted}]})
          share(buffer, keeper)

        # The hold comes before the keeper tracks the token: tracking it ends the hand-over's
        # hold, which may be all that keeps the buffer.
        :handed ->
          share(buffer, keeper)
          send(keeper, {:track, [{token, buffer, :adopted}]})

        nil ->
          :ok
      end
    end

    :ok
  end

  # A token made here is a binary of its own, the one the keeper tracks (a copy that came back
  # from another node is part of the binary of the message it came in); any other is looked up.
  defp made_here?(<<origin::64, _::binary>> = token, origin),
    do: :binary.referenced_byte_size(token) == byte_size(token)

  defp made_here?(_token, _origin), do: false

  # An unknown buffer, or a node that is down, is the next request's to report.
  defp share(buffer, keeper) do
    GenServer.call({:xla, node(buffer)}, {:share, [buffer], keeper}, 60_000)
  catch
    :exit, _reason -> :ok
  end

  # Whether this process is the one to take the key over, and how: `:new` when none of this
  # node's processes has (no `{key}` in the table), `:handed` when one was handed it
  # (`{key, :handed}`) and none has used it yet, `nil` otherwise. Atomic: of several processes
  # using the token at once, one takes it over. `nil` also when the table went with a keeper
  # that stopped: there is nothing to hold with.
  defp take_over(key) do
    case :ets.lookup(@table, key) do
      [{_key}] ->
        nil

      [{_key, :handed}] ->
        claimed? = :ets.select_replace(@table, [{{key, :handed}, [], [{{{:const, key}}}]}]) == 1
        if claimed?, do: :handed

      [] ->
        if :ets.insert_new(@table, {key}), do: :new
    end
  rescue
    ArgumentError -> nil
  end

  defp token?(token),
    do:
      byte_size(token) >= @smallest and byte_size(token) < @smallest + @sizes and
        match?(<<_::64, _::64, _::binary>>, token)

  @doc """
  Hands the buffers of `items` (`{token, buffer}` pairs that a process of this node holds) to
  `pid`, a process of another BEAM node, so that a message carrying them can be sent there
  and dropped here at once: `pid`'s node's keeper holds each buffer until a process of that
  node first uses it (`hold/2`: its keeper then holds it for as long as any process there
  holds the token, as for any tensor taken over), or until `pid` exits. Call it before the
  message goes, while this process still holds the tokens; it returns once the holds are
  taken (a round trip to `pid`'s node, and one from there to each buffer's node). A no-op
  for a `pid` of this node (the runtime counts its holders) or an empty list.

  A hold taken here outlives nothing: a tensor `pid` never uses is released when `pid` exits
  (its node going down releases it too), and one used there is held by its token from then
  on, whoever on that node holds it.

      # A process of another node of the cluster, running this client, that keeps what it gets.
      pid = Node.spawn(:"client@host", fn -> receive do: ({:params, _} -> Process.sleep(:infinity)) end)

      tensor = XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32})
      {:ok, buffer} = XlaNode.to_device(:"xla@host", tensor, owner: XlaNode.Keeper.owner())
      [token] = XlaNode.Keeper.track([buffer])
      :ok = XlaNode.Keeper.hand_over([{token, buffer}], pid)
      send(pid, {:params, {buffer, token}})
      # This process may drop both now: `pid`'s node holds the buffer.

  Errors: `:noproc` when `pid`'s node does not run the client's application (nothing there
  could hold the buffers), `:nodedown`, `:timeout`.
  """
  @spec hand_over([{token(), reference()}], pid(), timeout()) ::
          :ok | {:error, XlaNode.Error.t()}
  def hand_over(items, pid, timeout \\ 60_000)

  def hand_over(items, pid, _timeout) when is_list(items) and is_pid(pid) and node(pid) == node(),
    do: :ok

  def hand_over([], pid, _timeout) when is_pid(pid), do: :ok

  def hand_over(items, pid, timeout) when is_list(items) and is_pid(pid) do
    keyed =
      for item <- items, uniq: true do
        case item do
          {token, buffer} when is_binary(token) and is_reference(buffer) ->
            if token?(token), do: {key(token), buffer}, else: not_a_pair!(item)

          _other ->
            not_a_pair!(item)
        end
      end

    keeper = {__MODULE__, node(pid)}

    try do
      GenServer.call(keeper, {:hand_over, pid, keyed}, timeout)
    catch
      :exit, reason ->
        case XlaNode.Error.from_exit(reason, keeper) do
          %{kind: :noproc} = error ->
            {:error,
             %{
               error
               | message:
                   "no XlaNode.Keeper on #{inspect(node(pid))}: start the :xla_node_client " <>
                     "application there, whose keeper holds the buffers of its processes"
             }}

          error ->
            {:error, error}
        end
    end
  end

  defp not_a_pair!(item) do
    raise ArgumentError,
          "hand_over/3 takes {token, buffer} pairs (a token made by track/1, a buffer " <>
            "reference), got: #{inspect(item, limit: 8)}"
  end

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
  `sweeps`, `sweep_us` (their time, learning the tokens' ids included), `last_sweep_us` (the
  last one's), `interval_ms` (the wait before the next timed one) and `handed` (buffers handed
  over to this node's processes by `hand_over/3` and not used here yet).
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
       # another node in one message, parts of one binary).
       entries: %{},
       learnt: 0,
       # The ids that more than one token has: id => how many.
       shared_ids: %{},
       # Tokens whose id is to be learnt, in lists as they came. An item is {token, buffer}, or
       # {token, buffer, :adopted} for a token hold/2 took over (its key is in the table).
       pending: [],
       pending_count: 0,
       # Buffers freed on their nodes already (XlaNode.free_all/1 and the like), for which no
       # release is sent: buffer => the sweep it was told before, kept for @freed_sweeps sweeps.
       freed: %{},
       # The nodes released to since the last sweep/1 call, which confirms them.
       released_to: [],
       tracked_since: 0,
       # The tokens a sweep left: the next one comes after as many more are tracked (or
       # @sweep_after), so that what is dropped goes however many are kept.
       survivors: 0,
       timer: nil,
       # The wait before the timed sweep armed, and the shortest one the last sweep's time
       # allows.
       interval: @min_interval_ms,
       floor: @min_interval_ms,
       stats: %{tracked: 0, released: 0, sweeps: 0, last_sweep_us: 0, sweep_us: 0},
       # Buffers handed to processes of this node by another node's (hand_over/3), not used
       # here yet, each held once by this process: key => {buffer, the processes handed it};
       # and pid => {its monitor, the keys handed it}.
       pins: %{},
       pinned_by: %{}
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
    stats =
      Map.merge(state.stats, %{
        live: live(state),
        interval_ms: state.interval,
        handed: map_size(state.pins)
      })

    {:reply, stats, state}
  end

  def handle_call({:hand_over, pid, keyed}, _from, state) do
    new = for {key, buffer} <- keyed, not is_map_key(state.pins, key), do: buffer

    # A cast per node, then a call after it: the :xla server takes a process's messages in
    # order, and a share of a buffer that is gone already is skipped (its next use says so).
    for {node, buffers} <- Enum.group_by(new, &node/1) do
      GenServer.cast({:xla, node}, {:share, buffers, self()})
      XlaNode.ping(node, timeout: 5_000)
    end

    # Marked once held: a process of this node that uses the token takes it over.
    for {key, _buffer} <- keyed, do: :ets.insert(@table, {key, :handed})
    {:reply, :ok, pin(keyed, pid, state)}
  end

  @impl true
  def handle_info({:track, items}, state) do
    # The tracks queued behind this one too, without a callback each.
    {pending, count} = drain([items | state.pending], length(items), @drain)
    state = unpin_adopted(pending, state)

    state = %{
      state
      | pending: pending,
        pending_count: state.pending_count + count,
        tracked_since: state.tracked_since + count
    }

    if state.tracked_since >= max(@sweep_after, state.survivors) do
      {_released, state} = sweep_now(state)
      {:noreply, state}
    else
      {:noreply, arm_soon(state)}
    end
  end

  def handle_info({:freed, refs}, state) do
    sweep = state.stats.sweeps
    {:noreply, %{state | freed: Enum.reduce(refs, state.freed, &Map.put(&2, &1, sweep))}}
  end

  def handle_info(:sweep, state) do
    {_released, state} = sweep_now(%{state | timer: nil})
    {:noreply, state}
  end

  def handle_info({:DOWN, monitor, :process, pid, _reason}, state)
      when is_map_key(state.pinned_by, pid) do
    case Map.pop(state.pinned_by, pid) do
      {{^monitor, keys}, pinned_by} ->
        {:noreply, unpin(keys, pid, %{state | pinned_by: pinned_by})}

      _other ->
        {:noreply, state}
    end
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp pin(keyed, pid, state) do
    pins =
      Enum.reduce(keyed, state.pins, fn {key, buffer}, pins ->
        Map.update(pins, key, {buffer, MapSet.new([pid])}, fn {buffer, pids} ->
          {buffer, MapSet.put(pids, pid)}
        end)
      end)

    keys = MapSet.new(keyed, &elem(&1, 0))

    pinned_by =
      Map.update(state.pinned_by, pid, {Process.monitor(pid), keys}, fn {monitor, held} ->
        {monitor, MapSet.union(held, keys)}
      end)

    %{state | pins: pins, pinned_by: pinned_by}
  end

  # `pid` exited: the buffers handed to it and to no other process still here are released.
  defp unpin(keys, pid, state) do
    {unpinned, pins} =
      Enum.reduce(keys, {[], state.pins}, fn key, {unpinned, pins} ->
        case pins do
          %{^key => {buffer, pids}} ->
            pids = MapSet.delete(pids, pid)

            if MapSet.size(pids) == 0,
              do: {[{key, buffer} | unpinned], Map.delete(pins, key)},
              else: {unpinned, %{pins | key => {buffer, pids}}}

          %{} ->
            {unpinned, pins}
        end
      end)

    for {key, _buffer} <- unpinned, do: :ets.delete_object(@table, {key, :handed})
    release_pins(unpinned, %{state | pins: pins})
  end

  # Tokens taken over here (hold/2, whose own hold came first) end the holds of their buffers'
  # hand-overs.
  defp unpin_adopted(_pending, %{pins: pins} = state) when map_size(pins) == 0, do: state

  defp unpin_adopted(pending, state) do
    adopted =
      for items <- pending,
          {token, _buffer, :adopted} <- items,
          key = key(token),
          is_map_key(state.pins, key),
          uniq: true,
          do: key

    {unpinned, pins} = Map.split(state.pins, adopted)

    pinned_by =
      Enum.reduce(unpinned, state.pinned_by, fn {key, {_buffer, pids}}, pinned_by ->
        Enum.reduce(pids, pinned_by, fn pid, pinned_by ->
          case pinned_by do
            %{^pid => {monitor, keys}} ->
              keys = MapSet.delete(keys, key)

              if MapSet.size(keys) == 0 do
                Process.demonitor(monitor, [:flush])
                Map.delete(pinned_by, pid)
              else
                %{pinned_by | pid => {monitor, keys}}
              end

            %{} ->
              pinned_by
          end
        end)
      end)

    unpinned = for {key, {buffer, _pids}} <- unpinned, do: {key, buffer}
    release_pins(unpinned, %{state | pins: pins, pinned_by: pinned_by})
  end

  defp release_pins(unpinned, state) do
    released = for {_key, buffer} <- unpinned, not is_map_key(state.freed, buffer), do: buffer
    release_buffers(released, state)
  end

  @impl true
  def terminate(_reason, _state) do
    :persistent_term.erase(@identity)
    :ok
  end

  defp live(state), do: state.learnt + state.pending_count

  defp drain(pending, count, 0), do: {pending, count}

  defp drain(pending, count, left) do
    receive do
      {:track, items} -> drain([items | pending], count + length(items), left - 1)
    after
      0 -> {pending, count}
    end
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
      | tracked: state.stats.tracked + state.tracked_since,
        released: state.stats.released + length(gone),
        sweeps: state.stats.sweeps + 1,
        last_sweep_us: took,
        sweep_us: state.stats.sweep_us + took
    }

    floor = max(@min_interval_ms, div(took * @cpu_share, 1000))

    # A free is remembered for a few sweeps: its tokens go, in most programs, before that (a
    # release of a buffer freed already is skipped by its node anyway).
    freed = :maps.filter(fn _buffer, told -> told > stats.sweeps - @freed_sweeps end, state.freed)

    state = %{
      state
      | tracked_since: 0,
        stats: stats,
        floor: floor,
        freed: freed,
        survivors: live(state)
    }

    state = if live(state) > 0, do: arm(state, next_interval(state, changed?)), else: state
    {length(gone), state}
  end

  # Soon while tokens come and go, less often while nothing changes; never more than a
  # 1/@cpu_share of a CPU.
  defp next_interval(state, true = _changed?), do: state.floor

  defp next_interval(state, false),
    do: max(state.floor, min(state.interval * 2, @idle_interval_ms))

  # The tokens nobody but this process holds, taken out of `entries`: those of ids whose
  # count is the number of times this process's list names them (once, for most tokens: a
  # count of 1).
  defp take_unheld(binaries, state) do
    %{entries: entries, shared_ids: shared_ids} = state

    unheld =
      if map_size(shared_ids) == 0,
        do: unheld_alone(binaries, entries, []),
        else: unheld_shared(binaries, entries, shared_ids)

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

  # Every id has one token: a count of 1 says it (the common case, one clause a binary).
  defp unheld_alone([{id, _size, 1} | rest], entries, unheld) when is_map_key(entries, id),
    do: unheld_alone(rest, entries, [id | unheld])

  defp unheld_alone([_ | rest], entries, unheld), do: unheld_alone(rest, entries, unheld)
  defp unheld_alone([], _entries, unheld), do: unheld

  # Some ids have several: their count must be the times this list names them.
  defp unheld_shared(binaries, entries, shared_ids) do
    {unheld, seen} =
      Enum.reduce(binaries, {[], %{}}, fn
        {id, _size, count}, {unheld, seen} = acc ->
          cond do
            is_map_key(shared_ids, id) ->
              {unheld, Map.update(seen, id, {1, count}, fn {n, c} -> {n + 1, c} end)}

            count == 1 and is_map_key(entries, id) ->
              {[id | unheld], seen}

            true ->
              acc
          end
      end)

    unheld ++ for {id, {times, count}} <- seen, times == count, do: id
  end

  # Ends the tracking of `gone` (items whose tokens nobody else holds): each ends one hold of
  # this process on its buffer (holds are counted on the node: a buffer goes with its last),
  # unless the buffer was freed there already. The key of a token taken over leaves the table:
  # another copy of it still held somewhere is taken over again at its next use.
  defp release(gone, state) do
    released =
      for item <- gone, buffer = elem(item, 1), not is_map_key(state.freed, buffer) do
        with {token, _buffer, :adopted} <- item, do: :ets.delete_object(@table, {key(token)})
        buffer
      end

    release_buffers(released, state)
  end

  # One hold of this process on each buffer ends: one cast per node.
  defp release_buffers(buffers, state) do
    by_node = Enum.group_by(buffers, &node/1)
    for {node, refs} <- by_node, do: GenServer.cast({:xla, node}, {:release, refs, self()})
    %{state | released_to: Enum.uniq(Map.keys(by_node) ++ state.released_to)}
  end

  # The ids of the pending tokens, learnt by probes: each takes up to @sizes tokens of distinct
  # sizes. A probe that fails leaves its tokens pending for the next sweep. The id and the size
  # are those of the binary a token refers to: a token made on a node is one, a token that came
  # from another node is part of the binary of the message it came in.
  defp learn(%{pending_count: 0} = state), do: state

  defp learn(state) do
    groups =
      state.pending
      |> Enum.concat()
      |> Enum.group_by(&:binary.referenced_byte_size(elem(&1, 0)))
      |> Map.values()
      |> rounds([])

    {entries, shared_ids, learnt, left} =
      Enum.reduce(groups, {state.entries, state.shared_ids, 0, []}, fn group, acc ->
        {entries, shared_ids, learnt, left} = acc

        case probe(group) do
          {:ok, ids} ->
            {entries, shared_ids} = learnt(ids, group, entries, shared_ids)
            {entries, shared_ids, learnt + length(group), left}

          :error ->
            {entries, shared_ids, learnt, group ++ left}
        end
      end)

    %{
      state
      | entries: entries,
        shared_ids: shared_ids,
        learnt: state.learnt + learnt,
        pending: if(left == [], do: [], else: [left]),
        pending_count: length(left)
    }
  end

  defp learnt([id | ids], [item | items], entries, shared_ids) do
    case entries do
      %{^id => more} ->
        learnt(
          ids,
          items,
          %{entries | id => [item | more]},
          Map.put(shared_ids, id, length(more) + 1)
        )

      entries ->
        learnt(ids, items, Map.put(entries, id, [item]), shared_ids)
    end
  end

  defp learnt([], [], entries, shared_ids), do: {entries, shared_ids}

  # Groups of items with distinct sizes, from lists of one size each: one of each per round.
  defp rounds(lists, acc) do
    case for([item | _] <- lists, do: item) do
      [] -> acc
      round -> rounds(for([_ | rest] <- lists, do: rest), [round | acc])
    end
  end

  # A process holding only the group's tokens lists each once; it gives their ids in order.
  defp probe(group) do
    tokens = Enum.map(group, &elem(&1, 0))

    {_pid, monitor} =
      spawn_monitor(fn ->
        {:binary, binaries} = :erlang.process_info(self(), :binary)
        by_size = Map.new(binaries, fn {id, size, _count} -> {size, id} end)

        ids =
          if map_size(by_size) == length(binaries),
            do: Enum.map(tokens, &Map.get(by_size, :binary.referenced_byte_size(&1))),
            else: []

        exit({:probed, ids})
      end)

    receive do
      {:DOWN, ^monitor, :process, _pid, {:probed, ids}} ->
        if length(ids) == length(tokens) and not Enum.member?(ids, nil),
          do: {:ok, ids},
          else: :error

      {:DOWN, ^monitor, :process, _pid, _reason} ->
        :error
    end
  end
end
