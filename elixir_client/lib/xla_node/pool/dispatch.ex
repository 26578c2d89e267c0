defmodule XlaNode.Pool.Dispatch do
  @moduledoc false
  # What an `XlaNode` call given a pool does, in the calling process: choose a node from the
  # pool's table, send the request to that node itself, keep the counters, and re-send it
  # elsewhere when the node goes down. The pool process is asked only for what it owns:
  # compiling a program (on a node where it has no executable yet) and freeing one. So runs from
  # many processes go to the nodes side by side, never one at a time through the pool.
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
  %{node: node, attempts: attempts}}`, `node` being where the last attempt went (nil if none
  did) and `attempts` how many nodes the run was sent to.
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

      {:to_device, _tensor} ->
        anywhere(ctx, deadline, &XlaNode.call_node(&1, request, &2))

      # Placed on that device of whichever node the pool chooses.
      {:to_device, tensor, placement} ->
        anywhere(ctx, deadline, &XlaNode.to_device(&1, tensor, [timeout: &2] ++ placement))

      {:read, buffer} ->
        on_buffer_node(ctx, buffer, deadline, &XlaNode.call_node(&1, request, &2))

      {:free, %Executable{} = handle} ->
        free_program(ctx, handle, deadline)

      {:free, ref} ->
        on_buffer_node(ctx, ref, deadline, &XlaNode.call_node(&1, request, &2))

      request when request in [:info, :ping] ->
        anywhere(ctx, deadline, &XlaNode.call_node(&1, request, &2))

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
      error -> {error, %{node: nil, attempts: 0}}
    end
  end

  # Returns {result, %{node: node of the last attempt, attempts: attempts made}}.
  defp attempt_run(ctx, plan, attempt, tried) do
    case place(ctx, plan.handle.id, plan.pin, tried, plan.deadline) do
      {:ok, node, gen} ->
        # In flight from here: a run waiting for its program to compile on the node counts, so
        # that the runs placed meanwhile do not all pile onto a node that has none in flight yet.
        watch_caller(ctx)
        run = Table.start_run(ctx.tab, node)

        case executable(ctx, plan, node, gen) do
          {:ok, exe} ->
            send_run(ctx, plan, attempt, tried, node, exe, run)

          # The node went down while the pool compiled the program there: nothing ran.
          {:error, %Error{kind: kind} = error} when kind in [:nodedown, :noproc] ->
            Table.end_run(ctx.tab, run)
            Table.count(ctx.tab, node, :failures)
            failover(ctx, plan, attempt, tried, node, error, false)

          {:error, _} = error ->
            Table.end_run(ctx.tab, run)
            {error, %{node: node, attempts: attempt}}
        end

      error ->
        {error, %{node: List.first(tried), attempts: attempt - 1}}
    end
  end

  defp send_run(ctx, plan, attempt, tried, node, exe, run) do
    relay =
      if plan.handle.effects == :callbacks and may_retry?(plan, attempt) and
           plan.node_opts[:callback_server] != nil do
        Relay.start(callback_target(plan.node_opts[:callback_server]))
      end

    node_opts =
      if relay,
        do: Keyword.put(plan.node_opts, :callback_server, relay),
        else: plan.node_opts

    request =
      if node_opts == [], do: {:run, exe, plan.args}, else: {:run, exe, plan.args, node_opts}

    started = System.monotonic_time(:microsecond)
    result = XlaNode.call_node(node, request, remaining(plan.deadline))

    elapsed = System.monotonic_time(:microsecond) - started
    Table.end_run(ctx.tab, run)
    fired = relay != nil and Relay.close(relay)

    case result do
      {:ok, _} = ok ->
        Table.count(ctx.tab, node, :runs)
        Table.record_time(ctx.tab, plan.handle.id, node, elapsed)
        {ok, %{node: node, attempts: attempt}}

      {:error, %Error{kind: kind} = error} when kind in [:nodedown, :noproc] ->
        Table.count(ctx.tab, node, :failures)
        failover(ctx, plan, attempt, tried, node, error, fired)

      {:error, error} ->
        Table.count(ctx.tab, node, :errors)
        {{:error, %{error | node: error.node || node}}, %{node: node, attempts: attempt}}
    end
  end

  # The attempt on `node` ended without a result because the node went down (or has no `:xla`):
  # re-send the run elsewhere, or say why not.
  defp failover(ctx, plan, attempt, tried, node, error, fired) do
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
       %{node: node, attempts: attempt}}
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

  # The node for the next attempt: the pinned one if up, else the up node not tried yet with the
  # fewest runs in flight, then the lowest recent time of program `id` (nil: any program). With
  # none, a node still joining the pool (a pool just started, a node just added) is waited for.
  defp place(ctx, id, pin, tried, deadline) do
    case choose(ctx, id, pin, tried) do
      {:error, _} = error when tried == [] ->
        case pool_call(ctx, {:await_join, pin && elem(pin, 0)}, remaining(deadline)) do
          {:ok, :changed} -> place(ctx, id, pin, tried, deadline)
          _ -> error
        end

      chosen ->
        chosen
    end
  end

  defp choose(ctx, _id, {node, why}, _tried) do
    case Table.load(ctx.tab, node) do
      {:up, gen, _} ->
        {:ok, node, gen}

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

  defp choose(ctx, id, nil, tried) do
    ctx = %{ctx | nodes: Table.nodes(ctx.tab, ctx.nodes)}

    candidates =
      for node <- ctx.nodes,
          node not in tried,
          {:up, gen, in_flight} <- [Table.load(ctx.tab, node)] do
        {node, gen, {in_flight, recent(ctx, id, node, gen), :rand.uniform()}}
      end

    case candidates do
      [] ->
        {:error, none_up(ctx, tried)}

      [{node, gen, _}] ->
        {:ok, node, gen}

      _ ->
        {node, gen, _} = Enum.min_by(candidates, &elem(&1, 2))
        {:ok, node, gen}
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

  # Runs `fun.(node, timeout)` on a node the pool chooses (or on `pin`, `{node, :option}`), and
  # again on another if the node goes down first (compile, to_device, info, ping: nothing outside
  # sees them).
  defp anywhere(ctx, deadline, fun, pin \\ nil, attempt \\ 1, tried \\ []) do
    with {:ok, node, _gen} <- place(ctx, nil, pin, tried, deadline) do
      case fun.(node, remaining(deadline)) do
        {:error, %Error{kind: kind}}
        when kind in [:nodedown, :noproc] and pin == nil and attempt < ctx.max_attempts ->
          anywhere(ctx, deadline, fun, pin, attempt + 1, [node | tried])

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
      compile_on = fn node, timeout ->
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

      not match?({:up, _, _}, Table.load(ctx.tab, node)) ->
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
