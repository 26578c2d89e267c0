defmodule XlaNode.Pool.Dispatch do
  @moduledoc false
  # What an `XlaNode` call given a pool does, in the calling process: choose a node, and for a
  # run or a placed tensor a device of it, from the pool's table, send the request to that node
  # itself, keep the counters, and re-send it elsewhere when the node goes down. The pool
  # process is asked only for what it owns: compiling a program (on a node where it has no
  # executable yet) and freeing one. So runs from many processes go to the nodes side by side,
  # never one at a time through the pool.
  #
  # Every function returns what XlaNode's own call does: `{:ok, value}` or
  # `{:error, %XlaNode.Error{}}`; `run/3` with where the run went (see its doc). The requests go
  # to the nodes through `XlaNode.call_node/3`, the plain call to one node: a pool's run is one
  # `XlaNode.run/4` call, one telemetry span.

  alias XlaNode.Error
  alias XlaNode.Pool.{Effects, Executable, Relay, Table}

  @pool_run_options [:node, :retry, :max_attempts]

  @load_kernel "a pool does not load kernels: load one on each node of the pool " <>
                 "(XlaNode.load_kernel/5 with the node's name, or --kernel when it starts)"

  @doc """
  Serves one `XlaNode` run request through the pool described by `ctx`: returns `{result,
  %{node: node, device: device, attempts: attempts}}`, `node` and `device` being where the last
  attempt went (nil if none did; `device` nil too where the node chose it, by the run's
  buffers) and `attempts` how many nodes the run was sent to.
  """
  def run(ctx, {:run, exe, args}, timeout), do: run(ctx, exe, args, [], deadline(timeout))
  def run(ctx, {:run, exe, args, opts}, timeout), do: run(ctx, exe, args, opts, deadline(timeout))

  @doc "Serves one `XlaNode` request other than a run through the pool described by `ctx`."
  def request(ctx, request, timeout) do
    deadline = deadline(timeout)

    case request do
      {:compile, mlir} ->
        compile(ctx, mlir, [], deadline)

      {:compile, mlir, opts} ->
        compile(ctx, mlir, opts, deadline)

      # On the device with the fewest runs in flight, as a run with host arguments.
      {:to_device, tensor} ->
        place_tensor = fn
          node, nil, timeout ->
            XlaNode.call_node(node, request, timeout)

          node, device, timeout ->
            XlaNode.to_device(node, tensor, timeout: timeout, device: device)
        end

        anywhere(ctx, deadline, place_tensor, nil, :any_device)

      # Placed on that device of whichever node the pool chooses.
      {:to_device, tensor, placement} ->
        place_tensor = fn node, _device, timeout ->
          XlaNode.to_device(node, tensor, [timeout: timeout] ++ placement)
        end

        anywhere(ctx, deadline, place_tensor, nil, Keyword.get(placement, :device, :any_device))

      {:read, buffer} ->
        on_buffer_node(ctx, buffer, deadline, &XlaNode.call_node(&1, request, &2))

      {:free, %Executable{} = handle} ->
        free_program(ctx, handle, deadline)

      {:free, ref} ->
        on_buffer_node(ctx, ref, deadline, &XlaNode.call_node(&1, request, &2))

      {tag, refs, pid} when tag in [:share, :give_away] ->
        on_buffer_nodes(ctx, refs, deadline, &{tag, &1, pid})

      {:release, refs} ->
        on_buffer_nodes(ctx, refs, deadline, &{:release, &1})

      request when request in [:info, :ping] ->
        anywhere(ctx, deadline, fn node, _device, timeout ->
          XlaNode.call_node(node, request, timeout)
        end)

      {:load_kernel, _, _, _, _} ->
        {:error, Error.argument_error(@load_kernel)}

      other ->
        {:error, Error.argument_error("#{inspect(other, limit: 5)} cannot go through a pool")}
    end
  end

  ## Runs

  defp run(ctx, exe, args, opts, deadline) do
    # XlaNode.run/4 checked them.
    {pool_opts, node_opts} = Keyword.split(opts, @pool_run_options)

    with {:ok, handle} <- check_handle(ctx, exe),
         {:ok, pin} <- pin(ctx, args, Keyword.get(pool_opts, :node)) do
      plan = %{
        handle: handle,
        args: args,
        node_opts: node_opts,
        pin: pin,
        retry: Keyword.get(pool_opts, :retry, true) != false,
        max_attempts: Keyword.get(pool_opts, :max_attempts, ctx.max_attempts),
        deadline: deadline
      }

      attempt_run(ctx, plan, 1, [])
    else
      error -> {error, %{node: nil, device: nil, attempts: 0}}
    end
  end

  # Returns {result, %{node:, device:, attempts:}}: where the last attempt went, attempts made.
  defp attempt_run(ctx, plan, attempt, tried) do
    case place(ctx, plan.handle.id, plan.pin, tried, plan.deadline, wanted_device(plan)) do
      {:ok, node, gen, device} ->
        run_placed_at(ctx, plan, attempt, tried, {node, gen, device})

      error ->
        {error, %{node: List.first(tried), device: nil, attempts: attempt - 1}}
    end
  end

  defp wanted_device(plan), do: Keyword.get(plan.node_opts, :device, :any_device)

  defp run_placed_at(ctx, plan, attempt, tried, {node, _gen, device} = where) do
    if ctx.max_concurrency, do: note_saturation(ctx)
    # In flight from here: a run waiting for its program to compile on the node counts, so
    # that the runs placed meanwhile do not all pile onto a device that has none in flight yet.
    watch_caller(ctx)
    run = Table.start_run(ctx.tab, node, device)
    start_run_on(ctx, plan, attempt, tried, where, run)
  end

  # A pool that stops an idle node marks it :stopping and then reads its runs in flight; the
  # run, counted in flight, reads the status again: one of the two sees the other, so that a run
  # the pool placed never goes to a node being stopped (it is placed again instead). A run
  # pinned there goes: the node stops only once nothing is in flight and nothing held there.
  defp start_run_on(ctx, plan, attempt, tried, {node, gen, device}, run) do
    if serving?(Table.load(ctx.tab, node), plan.pin != nil) do
      run_placed(ctx, plan, attempt, tried, {node, gen, device}, run)
    else
      Table.end_run(ctx.tab, run)
      attempt_run(ctx, plan, attempt, tried)
    end
  end

  defp run_placed(ctx, plan, attempt, tried, {node, gen, device}, run) do
    case executable(ctx, plan, node, gen) do
      {:ok, exe} ->
        send_run(ctx, plan, attempt, tried, {node, device}, exe, run)

      # The node went down while the pool compiled the program there: nothing ran.
      {:error, %Error{kind: kind} = error} when kind in [:nodedown, :noproc] ->
        Table.end_run(ctx.tab, run)
        Table.count(ctx.tab, node, :failures)
        failover(ctx, plan, attempt, tried, {node, device}, error, false)

      {:error, _} = error ->
        Table.end_run(ctx.tab, run)
        {error, %{node: node, device: device, attempts: attempt}}
    end
  end

  # Whether a node whose load is `load` takes a run: up, or, for a pinned run, being drained.
  defp serving?({:up, _, _}, _pinned), do: true
  defp serving?({:stopping, _, _}, pinned), do: pinned
  defp serving?(_load, _pinned), do: false

  # Tells a pool that starts nodes that this run found every device of every node up with
  # `max_concurrency` runs in flight or more (once, until the pool has read it).
  defp note_saturation(ctx) do
    busy =
      Enum.all?(Table.nodes(ctx.tab, ctx.nodes), fn node ->
        case Table.load(ctx.tab, node) do
          {:up, _gen, in_flight} ->
            case Table.device_loads(ctx.tab, node) do
              [] -> in_flight >= ctx.max_concurrency
              loads -> Enum.all?(loads, fn {_device, load} -> load >= ctx.max_concurrency end)
            end

          _not_up ->
            true
        end
      end)

    if busy and Table.note_saturated(ctx.tab), do: send(ctx.pid, :saturated)
    :ok
  end

  defp send_run(ctx, plan, attempt, tried, {node, device} = where, exe, run) do
    relay =
      if plan.handle.effects == :callbacks and may_retry?(plan, attempt) and
           plan.node_opts[:callback_server] != nil do
        Relay.start(callback_target(plan.node_opts[:callback_server]))
      end

    node_opts =
      if relay,
        do: Keyword.put(plan.node_opts, :callback_server, relay),
        else: plan.node_opts

    # The device the pool chose (the caller's own `device:` is in the options already).
    node_opts =
      if device != nil and not Keyword.has_key?(node_opts, :device),
        do: Keyword.put(node_opts, :device, device),
        else: node_opts

    started = System.monotonic_time(:microsecond)
    {result, copies} = run_on(plan, node, exe, node_opts, plan.args)
    if copies != [], do: XlaNode.free_all(copies)

    elapsed = System.monotonic_time(:microsecond) - started
    Table.end_run(ctx.tab, run)
    fired = relay != nil and Relay.close(relay)
    where_map = %{node: node, device: device, attempts: attempt}

    case result do
      {:ok, _} = ok ->
        Table.count(ctx.tab, node, :runs)
        Table.count_device_run(ctx.tab, node, device)
        Table.record_time(ctx.tab, plan.handle.id, node, elapsed)
        {ok, where_map}

      {:error, %Error{kind: kind} = error} when kind in [:nodedown, :noproc] ->
        Table.count(ctx.tab, node, :failures)
        failover(ctx, plan, attempt, tried, where, error, fired)

      {:error, %Error{kind: :overloaded} = error} ->
        Table.count(ctx.tab, node, :errors)
        elsewhere(ctx, plan, attempt, tried, node, {{:error, error}, where_map})

      {:error, error} ->
        Table.count(ctx.tab, node, :errors)
        {{:error, %{error | node: error.node || node}}, where_map}
    end
  end

  # A run the node refused as :overloaded (its client node had its max_queued runs waiting
  # there) never started: it goes to another node of the pool that is up, if there is one
  # and the run may be re-sent; else the caller has the refusal.
  defp elsewhere(ctx, plan, attempt, tried, node, refused) do
    tried = [node | tried]

    with true <- may_retry?(plan, attempt),
         {:ok, next, gen, device} <- choose(ctx, plan.handle.id, nil, tried, wanted_device(plan)) do
      Table.count(ctx.tab, node, :retries)
      run_placed_at(ctx, plan, attempt + 1, tried, {next, gen, device})
    else
      _none -> refused
    end
  end

  # The node refuses a run whose buffers are on two of its devices. The pool put them there when
  # the caller named no device (a tensor placed through the pool, the results of runs it
  # placed), so the pool makes them meet: on such a refusal it asks the node where each buffer
  # argument lives (`{:describe, buffer}`), copies those off the first one's device there (read,
  # then placed, in chunks where large), as XlaNode.Backend sends a tensor of another node
  # along, and sends the run again on that device. Returns the run's result and the copies, for
  # the caller to free once it is answered.
  defp run_on(plan, node, exe, node_opts, args) do
    request = if node_opts == [], do: {:run, exe, args}, else: {:run, exe, args, node_opts}
    result = XlaNode.call_node(node, request, remaining(plan.deadline))

    with {:error, %Error{kind: :argument_error}} <- result,
         true <- pool_placed_buffers?(plan),
         {:ok, [{_, device} | _] = placed} <- buffer_devices(node, args, plan.deadline),
         true <- Enum.any?(placed, fn {_ref, on} -> on != device end),
         {:ok, moved} <- copy_misplaced(node, placed, device, plan.deadline) do
      args = Enum.map(args, &Map.get(moved, &1, &1))
      request = {:run, exe, args, Keyword.put(node_opts, :device, device)}
      {XlaNode.call_node(node, request, remaining(plan.deadline)), Map.values(moved)}
    else
      _ -> {result, []}
    end
  end

  defp pool_placed_buffers?(plan),
    do:
      match?({_node, {:buffer, _, _}}, plan.pin) and not Keyword.has_key?(plan.node_opts, :device)

  # `{buffer, device}` for each distinct buffer among `args`, in order.
  defp buffer_devices(node, args, deadline) do
    args
    |> Enum.filter(&is_reference/1)
    |> Enum.uniq()
    |> Enum.reduce_while({:ok, []}, fn ref, {:ok, acc} ->
      case XlaNode.call_node(node, {:describe, ref}, remaining(deadline)) do
        {:ok, %{device: device}} -> {:cont, {:ok, [{ref, device} | acc]}}
        _ -> {:halt, :error}
      end
    end)
    |> case do
      {:ok, placed} -> {:ok, Enum.reverse(placed)}
      :error -> :error
    end
  end

  # Copies of the buffers not on `device`, there: `%{buffer => copy}`. A failed copy frees those
  # made before it.
  defp copy_misplaced(node, placed, device, deadline) do
    Enum.reduce_while(placed, {:ok, %{}}, fn
      {_ref, ^device}, acc ->
        {:cont, acc}

      {ref, _elsewhere}, {:ok, moved} ->
        case copy_to_device(node, ref, device, deadline) do
          {:ok, copy} ->
            {:cont, {:ok, Map.put(moved, ref, copy)}}

          _ ->
            XlaNode.free_all(Map.values(moved))
            {:halt, :error}
        end
    end)
  end

  defp copy_to_device(node, ref, device, deadline) do
    with {:ok, tensor} <- XlaNode.call_node(node, {:read, ref}, remaining(deadline)) do
      XlaNode.call_node(node, {:to_device, tensor, [device: device]}, remaining(deadline))
    end
  end

  # The attempt on `node` ended without a result because the node went down (or has no `:xla`):
  # re-send the run elsewhere, or say why not.
  defp failover(ctx, plan, attempt, tried, {node, device}, error, fired) do
    # :noproc: the node never took the run, so its effects cannot have happened.
    never_ran = error.kind == :noproc

    why_not =
      cond do
        not plan.retry ->
          "the run says retry: false"

        plan.pin != nil ->
          pinned_why(plan.pin)

        match?({:side_effects, _}, plan.handle.effects) and not never_ran ->
          side_effects_why(plan)

        fired and not never_ran ->
          "a callback of the run had already fired"

        attempt >= plan.max_attempts ->
          "#{plan.max_attempts} attempts were made"

        true ->
          nil
      end

    if why_not do
      {{:error, lost(node, error, "; not re-sent: " <> why_not)},
       %{node: node, device: device, attempts: attempt}}
    else
      Table.count(ctx.tab, node, :retries)
      attempt_run(ctx, plan, attempt + 1, [node | tried])
    end
  end

  defp may_retry?(plan, attempt),
    do: plan.retry and plan.pin == nil and attempt < plan.max_attempts

  defp side_effects_why(%{handle: %{effects: {:side_effects, what}}}),
    do: "the program has side effects (#{what})"

  defp pinned_why({_node, :option}), do: "the run is pinned to it (node: option)"

  defp pinned_why({node, {:buffer, index, ref}}),
    do: "argument #{index}, buffer #{inspect(ref)}, was on #{node} and is lost with it"

  defp lost(node, error, why),
    do: Error.nodedown(node, "#{node} went down before the run finished#{why} (#{error.message})")

  # As XlaNode.run/4 does: a bare atom names a process registered on this node.
  defp callback_target(name) when is_atom(name), do: {name, node()}
  defp callback_target(target), do: target

  defp check_handle(ctx, %Executable{pool_ref: pool_ref, id: id} = handle) do
    cond do
      pool_ref != ctx.pool_ref -> {:error, foreign_handle(handle, ctx.label)}
      Table.program?(ctx.tab, id) -> {:ok, handle}
      true -> {:error, freed(id, ctx.label)}
    end
  end

  defp check_handle(ctx, exe) when is_reference(exe) do
    {:error,
     Error.argument_error(
       "#{inspect(exe)} is an executable of the node #{node(exe)} alone; " <>
         "run programs compiled through the pool (XlaNode.compile(#{inspect(ctx.label)}, mlir))"
     )}
  end

  defp check_handle(ctx, other) do
    {:error,
     Error.argument_error(
       "expected an executable compiled through the pool #{inspect(ctx.label)}, got #{inspect(other, limit: 5)}"
     )}
  end

  # Where the run must go: nil (anywhere), {node, :option}, or {node, {:buffer, index, ref}}.
  defp pin(ctx, args, nil) when is_list(args) do
    if Enum.any?(args, &is_reference/1), do: pin_buffers(ctx, args, nil), else: {:ok, nil}
  end

  defp pin(ctx, args, option), do: pin_buffers(ctx, args, option)

  defp pin_buffers(ctx, args, option) do
    buffers = for {arg, i} <- Enum.with_index(args), is_reference(arg), do: {node(arg), i, arg}

    with :ok <- member(ctx, option, fn -> "node: #{inspect(option)}" end),
         :ok <- buffers_members(ctx, buffers) do
      case {option, Enum.uniq_by(buffers, &elem(&1, 0))} do
        {nil, []} ->
          {:ok, nil}

        {node, []} ->
          {:ok, {node, :option}}

        {option, [{node, i, ref}]} when option in [nil, node] ->
          {:ok, {node, {:buffer, i, ref}}}

        {nil, [_, _ | _] = spread} ->
          where = Enum.map_join(spread, ", ", fn {node, i, _} -> "argument #{i} on #{node}" end)
          {:error, Error.argument_error("the run's buffers are on different nodes: #{where}")}

        {option, [{node, i, _} | _]} ->
          {:error,
           Error.argument_error(
             "node: #{inspect(option)}, but argument #{i} is a buffer on #{node}"
           )}
      end
    end
  end

  defp buffers_members(ctx, buffers) do
    Enum.reduce_while(buffers, :ok, fn {node, i, ref}, :ok ->
      case member(ctx, node, fn ->
             "argument #{i}, buffer #{inspect(ref)}, is on #{node}, which"
           end) do
        :ok -> {:cont, :ok}
        error -> {:halt, error}
      end
    end)
  end

  # `what` makes the message's subject, only when there is an error.
  defp member(_ctx, nil, _what), do: :ok

  defp member(ctx, node, what) do
    if node in ctx.nodes,
      do: :ok,
      else:
        {:error,
         Error.argument_error("#{what.()} is not a node of the pool #{inspect(ctx.label)}")}
  end

  # The program's executable on `node`: from the table, or compiled there by the pool.
  defp executable(ctx, plan, node, gen) do
    case Table.executable(ctx.tab, plan.handle.id, node) do
      {exe, ^gen, _recent} -> {:ok, exe}
      _ -> pool_call(ctx, {:executable, plan.handle.id, node}, remaining(plan.deadline))
    end
  end

  ## Placement

  # Where the next attempt goes: `{:ok, node, generation, device}`. The pinned node if up, else
  # the up node not tried yet whose chosen device has the fewest runs in flight, then the node
  # with the fewest, then the lowest recent time of program `id` (nil: any program), then chance.
  # `want` says which device: `:any_device` (the least loaded; nil where a buffer pins the run,
  # whose device the node takes from the buffers, or for a node that lists no devices), a device
  # index (the caller's), or `:no_device` (a compile, :info, :ping: the node alone). With no
  # node up, a node still joining the pool (a pool just started, a node just added) is waited
  # for.
  defp place(ctx, id, pin, tried, deadline, want) do
    case choose(ctx, id, pin, tried, want) do
      {:error, _} = error when tried == [] ->
        case pool_call(ctx, {:await_join, pin && elem(pin, 0)}, remaining(deadline)) do
          {:ok, :changed} -> place(ctx, id, pin, tried, deadline, want)
          # A pool that starts its nodes could not start one.
          {:error, %Error{kind: :launch_error}} = launch_error -> launch_error
          _ -> error
        end

      chosen ->
        chosen
    end
  end

  defp choose(ctx, id, {node, why}, _tried, want) do
    case Table.load(ctx.tab, node) do
      {status, gen, in_flight} when status in [:up, :stopping] ->
        device =
          case {want, why} do
            {:any_device, {:buffer, _, _}} ->
              nil

            _ ->
              {device, _key} = least_loaded(ctx, id, node, gen, in_flight, want)
              device
          end

        {:ok, node, gen, device}

      _ ->
        message =
          case why do
            :option ->
              "#{node}, which the run is pinned to (node: option), is not up"

            {:buffer, i, ref} ->
              "argument #{i}, buffer #{inspect(ref)}, was on #{node}, which is down: it is lost"
          end

        {:error, Error.nodedown(node, message)}
    end
  end

  defp choose(ctx, id, nil, tried, want) do
    ctx = %{ctx | nodes: Table.nodes(ctx.tab, ctx.nodes)}

    candidates =
      for node <- ctx.nodes,
          node not in tried,
          {:up, gen, in_flight} <- [Table.load(ctx.tab, node)] do
        {device, key} = least_loaded(ctx, id, node, gen, in_flight, want)
        {node, gen, device, key}
      end

    case candidates do
      [] ->
        {:error, none_up(ctx, tried)}

      [{node, gen, device, _}] ->
        {:ok, node, gen, device}

      _ ->
        {node, gen, device, _} = Enum.min_by(candidates, &elem(&1, 3))
        {:ok, node, gen, device}
    end
  end

  # `{device, key}` of `node`'s device that `want` allows with the lowest key: runs in flight on
  # the device, on the node, the program's recent time there, chance. Runs whose device the node
  # chose (by their buffers) count on the node alone.
  defp least_loaded(ctx, id, node, gen, in_flight, want) do
    recent = recent(ctx, id, node, gen)
    loads = Table.device_loads(ctx.tab, node)

    slots =
      case want do
        :any_device when loads != [] -> loads
        device when is_integer(device) -> [{device, device_load(loads, device, in_flight)}]
        _no_device_or_none_listed -> [{nil, in_flight}]
      end

    slots
    |> Enum.map(fn {device, load} -> {device, {load, in_flight, recent, :rand.uniform()}} end)
    |> Enum.min_by(&elem(&1, 1))
  end

  defp device_load(loads, device, node_in_flight) do
    case List.keyfind(loads, device, 0) do
      {^device, load} -> load
      nil -> node_in_flight
    end
  end

  defp recent(_ctx, nil, _node, _gen), do: 0

  defp recent(ctx, id, node, gen) do
    case Table.executable(ctx.tab, id, node) do
      {_exe, ^gen, recent} when recent != nil -> recent
      _ -> 0
    end
  end

  defp none_up(%{nodes: []} = ctx, _tried),
    do:
      Error.no_nodes(
        "the pool #{inspect(ctx.label)} has no nodes (XlaNode.Pool.add_node/2 adds one)"
      )

  defp none_up(ctx, tried) do
    where =
      Enum.map_join(ctx.nodes, ", ", fn node ->
        case Table.load(ctx.tab, node) do
          {:up, _, _} -> if node in tried, do: "#{node} (went down)", else: "#{node} (up)"
          {status, _, _} -> "#{node} (#{status})"
          nil -> "#{node} (removed)"
        end
      end)

    Error.nodes_down(ctx.nodes, "no node of the pool #{inspect(ctx.label)} is up: #{where}")
  end

  ## Everything else

  # Runs `fun.(node, device, timeout)` on a node the pool chooses (or on `pin`, `{node,
  # :option}`) and a device of it as `want` says (see place/6), and again on another node if the
  # node goes down first (compile, to_device, info, ping: nothing outside sees them).
  defp anywhere(ctx, deadline, fun, pin \\ nil, want \\ :no_device, attempt \\ 1, tried \\ []) do
    with {:ok, node, _gen, device} <- place(ctx, nil, pin, tried, deadline, want) do
      case fun.(node, device, remaining(deadline)) do
        {:error, %Error{kind: kind}}
        when kind in [:nodedown, :noproc] and pin == nil and attempt < ctx.max_attempts ->
          anywhere(ctx, deadline, fun, pin, want, attempt + 1, [node | tried])

        {:error, error} ->
          {:error, %{error | node: error.node || node}}

        ok ->
          ok
      end
    end
  end

  # `node:` compiles it there first; other options go to the node.
  defp compile(ctx, mlir, opts, deadline) do
    mlir = IO.iodata_to_binary(mlir)
    effects = Effects.of(mlir)
    {node, opts} = Keyword.pop(opts, :node)

    with :ok <- member(ctx, node, fn -> "node: #{inspect(node)}" end) do
      compile_on = fn node, _device, timeout ->
        pool_call(ctx, {:compile, mlir, opts, effects, node}, timeout)
      end

      anywhere(ctx, deadline, compile_on, node && {node, :option})
    end
  end

  defp free_program(ctx, handle, deadline) do
    with {:ok, handle} <- check_handle(ctx, handle) do
      pool_call(ctx, {:free, handle.id}, remaining(deadline))
    end
  end

  defp on_buffer_node(ctx, ref, deadline, fun) when is_reference(ref) do
    node = node(ref)

    cond do
      node not in ctx.nodes ->
        {:error,
         Error.argument_error(
           "#{inspect(ref)} is on #{node}, which is not a node of the pool #{inspect(ctx.label)}"
         )}

      not serving?(Table.load(ctx.tab, node), true) ->
        {:error,
         Error.nodedown(node, "#{inspect(ref)} was on #{node}, which is down: it is lost")}

      true ->
        fun.(node, remaining(deadline))
    end
  end

  defp on_buffer_node(_ctx, other, _deadline, _fun),
    do:
      {:error,
       Error.argument_error("expected a buffer reference, got #{inspect(other, limit: 5)}")}

  # A request on references of several nodes: one to each node with its references, in turn;
  # the first error, or :ok.
  defp on_buffer_nodes(ctx, refs, deadline, request) do
    refs
    |> List.wrap()
    |> Enum.group_by(&node/1)
    |> Enum.reduce_while({:ok, :ok}, fn {_node, [first | _] = refs}, ok ->
      case on_buffer_node(ctx, first, deadline, &XlaNode.call_node(&1, request.(refs), &2)) do
        {:ok, :ok} -> {:cont, ok}
        other -> {:halt, other}
      end
    end)
  end

  # The pool process's part; a pool that stopped meanwhile is an unknown pool.
  defp pool_call(ctx, request, timeout) do
    GenServer.call(ctx.pid, request, timeout)
  catch
    :exit, {:timeout, _} ->
      {:error, Error.timeout("no reply from the pool #{inspect(ctx.label)} in time")}

    :exit, reason ->
      {:error,
       Error.noproc("the pool #{inspect(ctx.label)} stopped (#{inspect(reason, limit: 5)})")}
  end

  # The pool monitors each process that runs through it once, to settle the runs it has in
  # flight if it dies before they end.
  defp watch_caller(ctx) do
    if Table.new_caller?(ctx.tab), do: send(ctx.pid, {:watch, self()})
    :ok
  end

  defp deadline(:infinity), do: :infinity
  defp deadline(ms) when is_integer(ms) and ms >= 0, do: System.monotonic_time(:millisecond) + ms

  defp remaining(:infinity), do: :infinity
  defp remaining(deadline), do: max(deadline - System.monotonic_time(:millisecond), 0)

  ## Errors the pool process shares

  def not_up(node), do: Error.nodedown(node, "#{node} is not up")

  def freed(id, label),
    do: Error.argument_error("program #{id} of the pool #{inspect(label)} was freed")

  def foreign_handle(%Executable{pool: pool} = handle, server) do
    Error.argument_error(
      "#{inspect(handle)} was compiled through the pool #{inspect(pool)}" <>
        if(pool == server, do: " before it restarted", else: ", not #{inspect(server)}") <>
        ": run it through the pool that compiled it"
    )
  end
end
