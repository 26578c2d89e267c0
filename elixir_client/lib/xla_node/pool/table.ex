defmodule XlaNode.Pool.Table do
  @moduledoc false
  # The pool's ETS table: what a caller reads to place a run and find the node's executable
  # without asking the pool process, and the counters it updates around the run. The pool
  # process owns the table (it goes when the pool does) and alone writes node status (kept here
  # only: the pool process reads it back too), the nodes' devices, programs and executables;
  # callers write only counters, run times and their runs in flight.
  #
  # Rows (an ordered set, so that the runs of one caller are one range):
  #
  #   {:meta, pool_ref, pool_pid, label, nodes, max_attempts, max_concurrency}
  #                                        max_concurrency: nil, or (a pool with a launcher)
  #                                        the runs in flight on a device at which it is busy
  #   {:saturated}                         a caller found every device busy and told the pool
  #                                        (present until the pool has read it: one message)
  #   {{:node, node}, status, generation, in_flight, runs, errors, failures, retries, recent_us}
  #   {{:device_names, node}, names}      the devices `:info` lists, in index order
  #   {{:devices, node}, in_flight_0, runs_0, in_flight_1, runs_1, ...}
  #                                        their counters, in one row of integers alone so
  #                                        that placement reads them with one small lookup
  #   {{:program, id}, effects}
  #   {{:exe, id, node}, exe_ref, generation, recent_us}
  #   {{:run, caller_pid, ref}, node, device}  a run in flight (device nil when the node chose
  #                                            it), settled by the pool if its caller dies
  #   {{:caller, caller_pid}}              a caller the pool monitors
  #
  # `generation` counts a node's comings up: an executable compiled before the node last went
  # down belongs to a process that no longer exists.
  #
  # Pools are found by name or pid through `:persistent_term` (written only when a pool starts
  # or stops), so that telling a pool from a node name costs one lookup.

  @status 2
  @generation 3
  @in_flight 4
  @counters %{runs: 5, errors: 6, failures: 7, retries: 8}
  @recent 9

  # Where a device's counters are in its node's devices row (1-based, as update_counter counts).
  defp device_position(device, :in_flight), do: 2 + 2 * device
  defp device_position(device, :runs), do: 3 + 2 * device

  defp device_count(row), do: div(tuple_size(row) - 1, 2)

  # Weight of the newest sample in the recent run times.
  @recent_weight 0.25

  def new,
    do:
      :ets.new(XlaNode.Pool, [
        :ordered_set,
        :public,
        read_concurrency: true,
        write_concurrency: true
      ])

  ## Registry

  def register(keys, tab), do: Enum.each(keys, &:persistent_term.put({XlaNode.Pool, &1}, tab))

  def unregister(keys, tab) do
    for key <- keys, :persistent_term.get({XlaNode.Pool, key}, nil) == tab do
      :persistent_term.erase({XlaNode.Pool, key})
    end

    :ok
  end

  @doc "The table of the pool registered as `server` (a name or a pid), or nil."
  def whereis(server) when is_atom(server) or is_pid(server),
    do: :persistent_term.get({XlaNode.Pool, server}, nil)

  def whereis(_server), do: nil

  ## The pool as a whole

  def put_meta(tab, pool_ref, label, nodes, max_attempts, max_concurrency),
    do: :ets.insert(tab, {:meta, pool_ref, self(), label, nodes, max_attempts, max_concurrency})

  @doc "What a caller needs of the pool; nil when the table is gone (the pool stopped)."
  def context(tab) do
    [{:meta, pool_ref, pid, label, nodes, max_attempts, max_concurrency}] =
      :ets.lookup(tab, :meta)

    %{
      tab: tab,
      pool_ref: pool_ref,
      pid: pid,
      label: label,
      nodes: nodes,
      max_attempts: max_attempts,
      max_concurrency: max_concurrency
    }
  rescue
    ArgumentError -> nil
  end

  @doc "The pool's nodes now (nodes may be added while a run fails over)."
  def nodes(tab, default) do
    case :ets.lookup(tab, :meta) do
      [{:meta, _, _, _, nodes, _, _}] -> nodes
      [] -> default
    end
  rescue
    ArgumentError -> default
  end

  @doc """
  Notes that a caller found every device busy; true when no such note was pending, that is
  when the caller should tell the pool (once, until the pool has read it).
  """
  def note_saturated(tab) do
    :ets.insert_new(tab, {:saturated})
  rescue
    ArgumentError -> false
  end

  @doc "Clears the note of `note_saturated/1` (the pool, once it has read it)."
  def clear_saturated(tab), do: :ets.delete(tab, :saturated)

  ## Nodes

  def put_node(tab, node),
    do: :ets.insert(tab, {{:node, node}, :connecting, 0, 0, 0, 0, 0, 0, nil})

  def delete_node(tab, node) do
    :ets.delete(tab, {:node, node})
    :ets.delete(tab, {:device_names, node})
    :ets.delete(tab, {:devices, node})
    delete_executables(tab, node)
  end

  @doc """
  Records the devices `node` has (`:info`'s `devices`, names in index order; nil for a node
  that does not list them). A device the node had before keeps its counters: a node restarted
  alike continues them.
  """
  def put_devices(tab, node, names) do
    names = if is_list(names), do: names, else: []

    before =
      case :ets.lookup(tab, {:devices, node}) do
        [row] -> row |> Tuple.to_list() |> tl()
        [] -> []
      end

    counters = Enum.take(before ++ List.duplicate(0, 2 * length(names)), 2 * length(names))
    :ets.insert(tab, {{:device_names, node}, names})
    :ets.insert(tab, List.to_tuple([{:devices, node} | counters]))
    :ok
  end

  @doc "`[{index, in_flight}]` of `node`'s devices, in index order (`[]` if it lists none)."
  def device_loads(tab, node) do
    case :ets.lookup(tab, {:devices, node}) do
      [row] ->
        for device <- 0..(device_count(row) - 1)//1,
            do: {device, max(elem(row, device_position(device, :in_flight) - 1), 0)}

      [] ->
        []
    end
  end

  @doc "`[%{device:, name:, in_flight:, runs:}]` of `node`'s devices, in index order."
  def device_info(tab, node) do
    case {:ets.lookup(tab, {:device_names, node}), :ets.lookup(tab, {:devices, node})} do
      {[{_, names}], [row]} ->
        for {name, i} <- Enum.with_index(names) do
          %{
            device: i,
            name: name,
            in_flight: max(elem(row, device_position(i, :in_flight) - 1), 0),
            runs: elem(row, device_position(i, :runs) - 1)
          }
        end

      _ ->
        []
    end
  end

  def set_status(tab, node, status),
    do: :ets.update_element(tab, {:node, node}, {@status, status})

  @doc "Marks `node` up in a new generation."
  def set_up(tab, node) do
    :ets.update_counter(tab, {:node, node}, {@generation, 1})
    set_status(tab, node, :up)
  end

  @doc "`%{status:, generation:, in_flight:, ...}` of `node`, or nil if the pool has no such node."
  def node_info(tab, node) do
    case :ets.lookup(tab, {:node, node}) do
      [{_, status, gen, in_flight, runs, errors, failures, retries, recent}] ->
        %{
          status: status,
          generation: gen,
          in_flight: max(in_flight, 0),
          runs: runs,
          errors: errors,
          failures: failures,
          retries: retries,
          recent_run_us: recent && round(recent)
        }

      [] ->
        nil
    end
  end

  @doc "`{status, generation, in_flight}` of `node`, or nil: the part placement reads."
  def load(tab, node) do
    case :ets.lookup(tab, {:node, node}) do
      [{_, status, gen, in_flight, _, _, _, _, _}] -> {status, gen, max(in_flight, 0)}
      [] -> nil
    end
  end

  def count(tab, node, counter) do
    :ets.update_counter(tab, {:node, node}, {Map.fetch!(@counters, counter), 1})
    :ok
  rescue
    ArgumentError -> :ok
  end

  @doc "Counts a run answered with results on `device` of `node` (nil: a device not known)."
  def count_device_run(_tab, _node, nil), do: :ok

  def count_device_run(tab, node, device), do: add_to_device(tab, node, device, :runs, 1)

  # A device the node does not have (an index the node refuses) has no counter: its position is
  # past the row's end, which update_counter refuses.
  defp add_to_device(_tab, _node, nil, _counter, _increment), do: :ok

  defp add_to_device(tab, node, device, counter, increment) do
    :ets.update_counter(tab, {:devices, node}, {device_position(device, counter), increment})
    :ok
  rescue
    ArgumentError -> :ok
  end

  ## Runs in flight

  @doc """
  Counts a run of the calling process on `node` (and on its `device`, unless nil: the node
  chooses) as in flight; returns its key.
  """
  def start_run(tab, node, device) do
    key = {:run, self(), make_ref()}
    :ets.insert(tab, {key, node, device})
    :ets.update_counter(tab, {:node, node}, {@in_flight, 1})
    add_to_device(tab, node, device, :in_flight, 1)
    key
  end

  @doc "Ends a run started with `start_run/3` (once, whoever ends it: the caller or the pool)."
  def end_run(tab, key) do
    case :ets.take(tab, key) do
      [{^key, node, device}] ->
        :ets.update_counter(tab, {:node, node}, {@in_flight, -1})
        add_to_device(tab, node, device, :in_flight, -1)

      [] ->
        :ok
    end
  rescue
    # The pool stopped meanwhile, and its table with it.
    ArgumentError -> :ok
  end

  @doc "Ends every run of `caller` (which died)."
  def end_runs_of(tab, caller) do
    for [key] <- :ets.match(tab, {{:run, caller, :"$1"}, :_, :_}) do
      end_run(tab, {:run, caller, key})
    end

    :ets.delete(tab, {:caller, caller})
  end

  @doc "Whether the pool watches the calling process already; marks it watched if not."
  def new_caller?(tab), do: :ets.insert_new(tab, {{:caller, self()}})

  def in_flight(tab), do: :ets.select_count(tab, [{{{:run, :_, :_}, :_, :_}, [], [true]}])

  ## Programs and executables

  def put_program(tab, id, effects), do: :ets.insert(tab, {{:program, id}, effects})

  def program?(tab, id), do: :ets.member(tab, {:program, id})

  def delete_program(tab, id) do
    :ets.delete(tab, {:program, id})
    :ets.match_delete(tab, {{:exe, id, :_}, :_, :_, :_})
  end

  def put_executable(tab, id, node, exe, gen),
    do: :ets.insert(tab, {{:exe, id, node}, exe, gen, nil})

  @doc "`{exe, generation, recent_us}` of program `id` on `node`, or nil."
  def executable(tab, id, node) do
    case :ets.lookup(tab, {:exe, id, node}) do
      [{_, exe, gen, recent}] -> {exe, gen, recent}
      [] -> nil
    end
  end

  @doc "`[{id, node, exe}]` of every executable."
  def executables(tab),
    do:
      for(
        [id, n, exe] <- :ets.match(tab, {{:exe, :"$1", :"$2"}, :"$3", :_, :_}),
        do: {id, n, exe}
      )

  @doc "`[{id, exe}]` of the executables on `node`."
  def executables_on(tab, node),
    do: for([id, exe] <- :ets.match(tab, {{:exe, :"$1", node}, :"$2", :_, :_}), do: {id, exe})

  def delete_executables(tab, node), do: :ets.match_delete(tab, {{:exe, :_, node}, :_, :_, :_})

  @doc "Records a run's wall time on `node`, for the program and the node."
  def record_time(tab, id, node, us) do
    with [{_, _, _, recent}] <- :ets.lookup(tab, {:exe, id, node}) do
      :ets.update_element(tab, {:exe, id, node}, {4, blend(recent, us)})
    end

    with [row] <- :ets.lookup(tab, {:node, node}) do
      :ets.update_element(tab, {:node, node}, {@recent, blend(elem(row, @recent - 1), us)})
    end

    :ok
  rescue
    ArgumentError -> :ok
  end

  defp blend(nil, us), do: us / 1
  defp blend(recent, us), do: recent + @recent_weight * (us - recent)
end
