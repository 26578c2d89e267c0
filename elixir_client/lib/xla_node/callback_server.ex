defmodule XlaNode.CallbackServer do
  @moduledoc """
  Serves the host callbacks of programs run with `XlaNode.run/4`.

  Programs in EXLA's form call back into Elixir through `stablehlo.custom_call
  @exla_runtime_callback` (with a callback id), and stream data through outfeed and infeed.
  Run them with `callback_server: pid_or_name` and the node sends this process:

    * `{:exla_runtime_call, callback_id, args, {pid, ref}}` - the callback registered for
      `callback_id` is called with `args` (a list of tensors, see `XlaNode.Tensor`) in a
      separate process, so that slow callbacks do not hold up others; its result is sent back
      as `{ref, {:ok, [binary]}}` or `{ref, {:error, {kind, message}}}`.
    * `{:exla_outfeed, args}` - handed to the `:outfeed` handler.
    * `{:exla_infeed, {pid, ref}, out_spec}` - answered with the next value pushed with
      `push_infeed/2`, as soon as there is one.

  ## Callbacks

  `callbacks` (the first argument of `start_link/2`) is either

    * a function `fn callback_id, args -> result end`, called for every id, or
    * a map `%{callback_id => fun}`, where `fun` takes `args` (arity 1) or
      `callback_id, args` (arity 2).

  A callback returns

    * `{:ok, results}` - one entry per result of the custom call, each a binary of exactly the
      result's size (for 2- and 4-bit types a bitstring of `size * bits` bits, as
      `Nx.to_binary/1` gives it), or a tensor (`{binary, {type, dims}}`, whose binary is sent)
    * `{:error, {kind, message}}` - `kind` an atom, `message` a binary (other terms are
      inspected); the run then fails with that error

  Anything else is answered with `{:error, {:runtime_error, "..."}}`. Failures follow EXLA's
  `EXLA.CallbackServer`: a raised exception becomes `{:error, {:runtime_error,
  "Elixir callback raised ArgumentError: message"}}`, a throw or an exit
  `{:error, {:runtime_error, "Elixir callback threw: ..."}}` / `"... exited: ..."`, and so is a
  callback whose process ends before it has replied (killed from outside, or ending itself,
  even with `:normal`): `"Elixir callback exited: :killed"`. An id with no callback is answered
  with `{:error, {:unknown_callback, "no callback registered for id ..."}}`.

  Each callback run is a `[:xla_node, :callback]` `:telemetry` span when the application has
  `:telemetry` (see `XlaNode.Telemetry`).

  ## Options

    * `:name` - registers the server (as with `GenServer.start_link/3`): an atom,
      `{:global, term}` or `{:via, module, term}`
    * `:outfeed` - where outfeed values go: a pid, a registered name or `{name, node}`, which
      receives `{:xla_outfeed, args}`, or a function of one argument called with `args` (in the
      server process, one at a time, in arrival order). Without it outfeed values are dropped.
    * `:debug`, `:spawn_opt`, `:hibernate_after` - as for `GenServer.start_link/3`

  Any other option raises an `ArgumentError` listing these.

  ## Example

  A program whose `main` calls back into Elixir for `:double` (see
  `XlaNode.MLIR.runtime_call/4`), run on the node `:"xla@host"`:

      {:ok, cb} =
        XlaNode.CallbackServer.start_link(%{
          double: fn [{bin, {{:f, 32}, dims}}] ->
            values = XlaNode.Tensor.to_list({bin, {{:f, 32}, dims}})
            {:ok, [XlaNode.Tensor.from_list(Enum.map(values, &(&1 * 2)), {:f, 32})]}
          end
        })

      mlir =
        XlaNode.MLIR.module(fn ->
          XlaNode.MLIR.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [3]}], fn [handle, x] ->
            [y] = XlaNode.MLIR.runtime_call(handle, :double, [x], [{{:f, 32}, [3]}])
            XlaNode.MLIR.add(y, x)
          end)
        end)

      exe = XlaNode.compile!(:"xla@host", mlir)
      x = XlaNode.Tensor.from_list([1.0, 2.0, 3.0], {:f, 32})
      # The node supplies the callback handle (the first parameter) itself.
      {:ok, [y]} = XlaNode.run(:"xla@host", exe, [x], callback_server: cb)
      XlaNode.Tensor.to_list(y)
      #=> [3.0, 6.0, 9.0]
  """

  use GenServer

  require Logger

  alias XlaNode.{Options, Tensor}

  @options [
    name: :name,
    outfeed: :outfeed,
    debug: :list,
    spawn_opt: :list,
    hibernate_after: :timeout
  ]
  @gen_server_options [:name, :debug, :spawn_opt, :hibernate_after]

  @typedoc "A callback: see the module documentation."
  @type callback ::
          (term(), [Tensor.t()] -> callback_result())
          | ([Tensor.t()] -> callback_result())

  @type callback_result :: {:ok, [binary() | Tensor.t()]} | {:error, {atom(), String.t()}}

  @type callbacks ::
          (term(), [Tensor.t()] -> callback_result()) | %{optional(term()) => callback()}

  @type option ::
          {:name, GenServer.name()}
          | {:outfeed, pid() | atom() | {atom(), node()} | (list() -> any())}
          | {:debug, list()}
          | {:spawn_opt, list()}
          | {:hibernate_after, timeout()}

  ## API

  @doc """
  Starts a callback server linked to the caller.

      iex> {:ok, cb} = XlaNode.CallbackServer.start_link(fn _id, [x] -> {:ok, [x]} end)
      iex> is_pid(cb)
      true
      iex> callbacks = %{echo: fn args -> {:ok, args} end}
      iex> {:ok, _} = XlaNode.CallbackServer.start_link(callbacks, name: MyCallbacks, outfeed: self())
      iex> is_pid(Process.whereis(MyCallbacks))
      true
      iex> XlaNode.CallbackServer.start_link(callbacks, outfeed: :nowhere, timeout: 5)
      ** (ArgumentError) XlaNode.CallbackServer.start_link/2: unknown option :timeout; valid options: :debug, :hibernate_after, :name, :outfeed, :spawn_opt
  """
  @spec start_link(callbacks(), [option()]) :: GenServer.on_start()
  def start_link(callbacks, opts \\ []) do
    {gen_opts, opts} = split_options!(callbacks, opts, "start_link/2")
    GenServer.start_link(__MODULE__, {callbacks, opts}, gen_opts)
  end

  @doc """
  Like `start_link/2` but without a link.

      iex> {:ok, cb} = XlaNode.CallbackServer.start(fn _id, args -> {:ok, args} end)
      iex> Process.info(self(), :links) |> elem(1) |> Enum.member?(cb)
      false
  """
  @spec start(callbacks(), [option()]) :: GenServer.on_start()
  def start(callbacks, opts \\ []) do
    {gen_opts, opts} = split_options!(callbacks, opts, "start/2")
    GenServer.start(__MODULE__, {callbacks, opts}, gen_opts)
  end

  @doc """
  A child spec, for `{XlaNode.CallbackServer, callbacks}` or
  `{XlaNode.CallbackServer, {callbacks, opts}}` in a supervisor.

      iex> double = fn [x] -> {:ok, [x <> x]} end
      iex> children = [{XlaNode.CallbackServer, {%{double: double}, name: MySupervisedCallbacks}}]
      iex> {:ok, _supervisor} = Supervisor.start_link(children, strategy: :one_for_one)
      iex> is_pid(Process.whereis(MySupervisedCallbacks))
      true
  """
  @spec child_spec(callbacks() | {callbacks(), [option()]}) :: Supervisor.child_spec()
  def child_spec({callbacks, opts}) do
    split_options!(callbacks, opts, "child_spec/1")

    %{
      id: Keyword.get(opts, :name, __MODULE__),
      start: {__MODULE__, :start_link, [callbacks, opts]}
    }
  end

  def child_spec(callbacks), do: child_spec({callbacks, []})

  @doc """
  Registers (or replaces) the callback for `id`. Only for servers started with a map.

      iex> {:ok, cb} = XlaNode.CallbackServer.start_link(%{})
      iex> XlaNode.CallbackServer.put_callback(cb, :echo, fn [x] -> {:ok, [x]} end)
      :ok
      iex> {:ok, any_id} = XlaNode.CallbackServer.start_link(fn _id, args -> {:ok, args} end)
      iex> XlaNode.CallbackServer.put_callback(any_id, :echo, fn [x] -> {:ok, [x]} end)
      {:error, :not_a_map}
  """
  @spec put_callback(GenServer.server(), term(), callback()) :: :ok | {:error, :not_a_map}
  def put_callback(server, id, fun) when is_function(fun, 1) or is_function(fun, 2),
    do: GenServer.call(server, {:put_callback, id, fun})

  @doc """
  Queues a value for the program's next infeed: a list with one binary (or tensor) per element of
  the infeed's shape. If the program is already waiting for one, it gets it at once. Values are
  consumed in the order they were pushed.

      iex> {:ok, cb} = XlaNode.CallbackServer.start_link(%{})
      iex> XlaNode.CallbackServer.push_infeed(cb, [XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32})])
      :ok
      iex> XlaNode.CallbackServer.push_infeed(cb, [<<3.0::float-little-32, 4.0::float-little-32>>])
      :ok
      iex> XlaNode.CallbackServer.infeed_status(cb)
      %{queued: 2, waiting: 0}
  """
  @spec push_infeed(GenServer.server(), [binary() | Tensor.t()]) :: :ok
  def push_infeed(server, values) when is_list(values),
    do: GenServer.call(server, {:push_infeed, Enum.map(values, &to_binary/1)})

  @doc """
  How many values are queued for infeed and how many infeed requests are waiting for one.

      iex> {:ok, cb} = XlaNode.CallbackServer.start_link(%{})
      iex> XlaNode.CallbackServer.infeed_status(cb)
      %{queued: 0, waiting: 0}
  """
  @spec infeed_status(GenServer.server()) :: %{
          queued: non_neg_integer(),
          waiting: non_neg_integer()
        }
  def infeed_status(server), do: GenServer.call(server, :infeed_status)

  ## GenServer

  # Checks the callbacks and the options in the caller, before any process starts; returns the
  # GenServer's options and the server's own.
  defp split_options!(callbacks, opts, function) do
    unless is_function(callbacks, 2) or is_map(callbacks) do
      raise ArgumentError,
            "#{inspect(__MODULE__)}.#{function}: callbacks must be a function of two arguments " <>
              "or a map of functions, got: #{inspect(callbacks)}"
    end

    opts
    |> Options.validate!("#{inspect(__MODULE__)}.#{function}", @options)
    |> Keyword.split(@gen_server_options)
  end

  @impl true
  def init({callbacks, opts}) do
    {:ok,
     %{
       callbacks: callbacks,
       outfeed: Keyword.get(opts, :outfeed),
       # infeed values pushed and not taken yet, and infeed requests waiting for a value
       infeed: :queue.new(),
       waiting: :queue.new(),
       # pid => {monitor, reply tag}, for callbacks running in their own process
       tasks: %{}
     }}
  end

  @impl true
  def handle_call({:put_callback, id, fun}, _from, %{callbacks: callbacks} = state)
      when is_map(callbacks) do
    {:reply, :ok, %{state | callbacks: Map.put(callbacks, id, fun)}}
  end

  def handle_call({:put_callback, _, _}, _from, state) do
    {:reply, {:error, :not_a_map}, state}
  end

  def handle_call({:push_infeed, values}, _from, state) do
    case :queue.out(state.waiting) do
      {{:value, {reply_to, out_spec}}, waiting} ->
        reply_infeed(reply_to, out_spec, values)
        {:reply, :ok, %{state | waiting: waiting}}

      {:empty, _} ->
        {:reply, :ok, %{state | infeed: :queue.in(values, state.infeed)}}
    end
  end

  def handle_call(:infeed_status, _from, state) do
    {:reply, %{queued: :queue.len(state.infeed), waiting: :queue.len(state.waiting)}, state}
  end

  @impl true
  def handle_info({:exla_runtime_call, id, args, reply_to}, state) do
    case lookup(state.callbacks, id) do
      {:ok, fun} ->
        metadata = %{node: caller_node(reply_to), callback_server: self(), callback_id: id}

        server = self()

        {pid, monitor} =
          spawn_monitor(fn ->
            reply(reply_to, run_callback(fun, id, args, metadata))
            send(server, {__MODULE__, :replied, self()})
          end)

        {:noreply, put_in(state.tasks[pid], {monitor, reply_to})}

      :error ->
        message = "no callback registered for id #{inspect(id)} in #{inspect(self())}"
        reply(reply_to, {:error, {:unknown_callback, message}})
        {:noreply, state}
    end
  end

  def handle_info({:exla_outfeed, args}, state) do
    deliver_outfeed(state.outfeed, args)
    {:noreply, state}
  end

  def handle_info({:exla_infeed, reply_to, out_spec}, state) do
    case :queue.out(state.infeed) do
      {{:value, values}, infeed} ->
        reply_infeed(reply_to, out_spec, values)
        {:noreply, %{state | infeed: infeed}}

      {:empty, _} ->
        {:noreply, %{state | waiting: :queue.in({reply_to, out_spec}, state.waiting)}}
    end
  end

  # A callback's process says it has replied before it ends (before its :DOWN, which comes
  # from the same process): it is done with.
  def handle_info({__MODULE__, :replied, pid}, state) do
    {task, tasks} = Map.pop(state.tasks, pid)
    with {monitor, _reply_to} <- task, do: Process.demonitor(monitor, [:flush])
    {:noreply, %{state | tasks: tasks}}
  end

  # One that ends without having replied (killed from outside, or ending its own process, even
  # with :normal) leaves the program waiting: answer for it.
  def handle_info({:DOWN, _monitor, :process, pid, reason}, state) do
    case Map.pop(state.tasks, pid) do
      {{_monitor, reply_to}, tasks} ->
        reply(reply_to, {:error, {:runtime_error, "Elixir callback exited: #{inspect(reason)}"}})
        {:noreply, %{state | tasks: tasks}}

      {nil, _tasks} ->
        {:noreply, state}
    end
  end

  def handle_info(message, state) do
    Logger.debug("#{inspect(__MODULE__)} ignoring unexpected message: #{inspect(message)}")
    {:noreply, state}
  end

  ## Helpers

  defp lookup(fun, _id) when is_function(fun, 2), do: {:ok, fun}

  defp lookup(callbacks, id) when is_map(callbacks) do
    case Map.fetch(callbacks, id) do
      {:ok, fun} when is_function(fun, 2) -> {:ok, fun}
      {:ok, fun} when is_function(fun, 1) -> {:ok, fn _id, args -> fun.(args) end}
      _ -> :error
    end
  end

  # Inside a [:xla_node, :callback] telemetry span; an exception is reported by the span, then
  # answered here.
  defp run_callback(fun, id, args, metadata) do
    XlaNode.Telemetry.span(:callback, metadata, fn ->
      result = fun.(id, args) |> normalize_result()
      {result, XlaNode.Telemetry.stop_metadata(metadata, result)}
    end)
  rescue
    exception ->
      {:error,
       {:runtime_error,
        "Elixir callback raised #{inspect(exception.__struct__)}: #{Exception.message(exception)}"}}
  catch
    :throw, value -> {:error, {:runtime_error, "Elixir callback threw: #{inspect(value)}"}}
    :exit, reason -> {:error, {:runtime_error, "Elixir callback exited: #{inspect(reason)}"}}
  end

  defp normalize_result({:ok, results} = result) when is_list(results) do
    if Enum.all?(results, &(is_bitstring(&1) or tensor?(&1))) do
      {:ok, Enum.map(results, &to_binary/1)}
    else
      invalid(result)
    end
  end

  defp normalize_result({:error, {kind, message}}) when is_atom(kind) and is_binary(message),
    do: {:error, {kind, message}}

  defp normalize_result({:error, {kind, message}}) when is_atom(kind),
    do: {:error, {kind, inspect(message)}}

  defp normalize_result({:error, reason}),
    do: {:error, {:runtime_error, "Elixir callback error: #{inspect(reason)}"}}

  defp normalize_result(other), do: invalid(other)

  defp invalid(other) do
    {:error,
     {:runtime_error,
      "expected the callback to return {:ok, [binary]} or {:error, {kind, message}}, " <>
        "got: #{inspect(other, limit: 20, printable_limit: 100)}"}}
  end

  defp tensor?({bin, {_type, dims}}) when is_bitstring(bin) and is_list(dims), do: true
  defp tensor?(_), do: false

  defp to_binary(bin) when is_bitstring(bin), do: bin
  defp to_binary({bin, {_type, _dims}}) when is_bitstring(bin), do: bin

  defp to_binary(other),
    do: raise(ArgumentError, "expected a binary or a tensor, got #{inspect(other)}")

  # Checks the pushed binaries against what the infeed expects before answering with them.
  defp reply_infeed(reply_to, out_spec, values) do
    reply =
      case check_infeed(out_spec, values) do
        :ok -> {:ok, values}
        {:error, message} -> {:error, {:argument_error, message}}
      end

    reply(reply_to, reply)
  end

  defp check_infeed(out_spec, values) when is_list(out_spec) do
    expected = Enum.map(out_spec, fn {type, dims} -> Tensor.bit_size(type, dims) end)
    given = Enum.map(values, &bit_size/1)

    # Sizes in bytes, unless a value is not a whole number of them (2- and 4-bit types).
    {unit, scale} =
      if Enum.all?(expected ++ given, &(rem(&1, 8) == 0)), do: {"bytes", 8}, else: {"bits", 1}

    sizes = fn sizes -> inspect(Enum.map(sizes, &div(&1, scale)), charlists: :as_lists) end

    if expected == given,
      do: :ok,
      else:
        {:error,
         "infeed expects #{length(expected)} value(s) of #{sizes.(expected)} #{unit} " <>
           "(#{inspect(out_spec)}), got #{length(given)} of #{sizes.(given)} #{unit}"}
  rescue
    # A type this library does not know: let the node check the sizes.
    _ -> :ok
  end

  defp check_infeed(_out_spec, _values), do: :ok

  defp reply({pid, ref}, reply), do: send(pid, {ref, reply})

  defp reply(tag, reply) do
    Logger.error("#{inspect(__MODULE__)} cannot reply #{inspect(reply)} to tag #{inspect(tag)}")
  end

  defp caller_node({pid, _ref}) when is_pid(pid), do: node(pid)
  defp caller_node(_tag), do: nil

  defp deliver_outfeed(nil, _args), do: :ok

  defp deliver_outfeed(fun, args) when is_function(fun, 1) do
    fun.(args)
  rescue
    exception ->
      Logger.error(
        "#{inspect(__MODULE__)} outfeed handler raised: " <>
          Exception.format(:error, exception, __STACKTRACE__)
      )
  end

  defp deliver_outfeed(dest, args) do
    send(dest, {:xla_outfeed, args})
  rescue
    # A name that is not registered (any more).
    ArgumentError ->
      Logger.error("#{inspect(__MODULE__)} outfeed destination #{inspect(dest)} is not alive")
  end
end
