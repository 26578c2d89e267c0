defmodule XlaNode do
  @moduledoc """
  Client for `xla_node`, a hidden Erlang node that compiles and runs XLA programs.

  The node registers a process named `:xla`; every function here is a `GenServer.call/3` to it.
  Connect to the node the usual way (same cookie, `Node.connect/1` or just call it: distribution
  connects on first use) and pass its node name as the `server`:

      node = :"xla@host"

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"

      {:ok, exe} = XlaNode.compile(node, mlir)
      x = XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})
      {:ok, [y]} = XlaNode.run(node, exe, [x])
      XlaNode.Tensor.to_list(y)
      #=> [2.0, 3.0, 4.0, 5.0]

  (Every example in these docs that names `:"xla@host"` runs as shown against a node of that
  name: the integration suite runs them.)

  ## Servers

  `server` is either a node name (an atom, meaning `{:xla, node}`) or any other
  `t:GenServer.server/0` term: a pid, `{name, node}`, `{:global, name}`, `{:via, mod, name}`.
  A local registered name must be given as `{name, node()}`, since a bare atom means a node.

  `server` may also be an `XlaNode.Pool` (its name, an atom without `"@"`, or its pid): the
  pool chooses a node for each call and re-sends a run elsewhere when its node goes down. And
  it may be the name of an `XlaNode.Local`, a node this application started: the call goes to
  its node.

  ## Results and errors

  Functions return `{:ok, result}` or `{:error, %XlaNode.Error{}}` (`free/3` returns `:ok`,
  `ping/2` returns `:pong`). Errors reported by the node keep their kind (`:argument_error`,
  `:compile_error`, `:runtime_error`). A call that cannot complete does not exit the caller: it
  returns an error of kind `:noproc` (nothing registered as `:xla` there), `:nodedown` (no
  connection), `:timeout` or `:exit`. Bang variants raise the `XlaNode.Error` instead.

  ## Tensors and buffers

  A tensor is `{binary, {type, dims}}`: `type` is an Nx type such as `{:f, 32}` or `{:u, 4}`,
  `dims` a list, `binary` the row-major little-endian data as `Nx.to_binary/1` gives it (a
  bitstring for 2- and 4-bit types). `XlaNode.Tensor` builds and reads them.

  Executables and device buffers are references held by the process that created them (or by
  the `:owner` that `run/4` and `to_device/3` name): the node frees them when their last holder
  exits (or its node disconnects), or at once with `free/3` and `free_all/1`, whoever holds
  them. Knowing a reference is enough to use it, from any process; to keep it alive past its
  maker, hand the hold over with `give_away/4` (as `:ets.give_away/3` hands a table), add a
  holder with `share/4`, and end one with `release/3`. `XlaNode.Keeper` holds buffers while any
  process holds their tokens instead, as `XlaNode.Backend` does for every Nx tensor.

  ## Options

  Each function documents the options it takes. An option it does not know (a typo such as
  `keep_on_devise: true`), or a known one with a value of the wrong kind, raises an
  `ArgumentError` that names the option and lists the valid ones, before anything is sent.

  ## Timeouts

  Every function takes a `:timeout` option (milliseconds or `:infinity`). `compile/3` and `run/4`,
  whose duration depends on the program, default to `:infinity`; the others default to
  `60_000`. A node that goes down or disconnects still ends an `:infinity` call (with a
  `:nodedown` error), because `GenServer.call/3` monitors the server.

  ## Telemetry

  `compile/3`, `run/4` and the callbacks `XlaNode.CallbackServer` runs emit `:telemetry` spans
  when the application has `:telemetry` (an optional dependency): see `XlaNode.Telemetry`.
  """

  alias XlaNode.{Error, Options, Telemetry}

  @default_timeout 60_000

  @run_options [
    device: :non_neg_integer,
    keep_on_device: :boolean_or_indices,
    wait: :boolean,
    callback_server: :process,
    callback_timeout: :positive_timeout,
    queue_timeout: :timeout,
    priority: {:in, [:high, :normal, :low]},
    timeout: :timeout,
    telemetry_metadata: :map,
    owner: :pid
  ]

  # What a run through an XlaNode.Pool takes besides.
  @pool_run_options [node: :name, retry: :boolean, max_attempts: :pos_integer]

  @typedoc "A node name (meaning `{:xla, node}`), any `GenServer` server, or an `XlaNode.Pool`."
  @type server :: node() | GenServer.server() | XlaNode.Pool.t()

  @typedoc "An executable returned by `compile/3` (from a pool: an `XlaNode.Pool.Executable`)."
  @type executable :: reference() | XlaNode.Pool.Executable.t()

  @typedoc "A device buffer returned by `to_device/3` or `run/4` with `keep_on_device: true`."
  @type buffer :: reference()

  @typedoc "`{binary, {type, dims}}`; see `XlaNode.Tensor`."
  @type tensor :: XlaNode.Tensor.t()

  @type error :: {:error, Error.t()}

  @doc """
  Compiles a StableHLO/MLIR module (text or bytecode) into an executable.

  Options:

    * `:timeout` - how long to wait for the executable, in milliseconds or `:infinity` (default
      `:infinity`)
    * `:telemetry_metadata` - a map added to the metadata of the call's `:telemetry` events
      (see `XlaNode.Telemetry`)
    * `:node` - only with an `XlaNode.Pool`: the node to compile it on first (default: the one
      the pool would send a run to)
    * `:devices` - not with a pool: compile one SPMD program over these devices of the node
      (indices into `info/2`'s `devices`), one partition each, split as the module's sharding
      annotations say. `run/4` then takes one list of arguments per device, in this order, and
      returns one list of results per device

  ## Examples

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"
      {:ok, exe} = XlaNode.compile(:"xla@host", mlir)

      {:error, %XlaNode.Error{kind: :compile_error}} = XlaNode.compile(:"xla@host", "nonsense")
  """
  @spec compile(server(), iodata(), keyword()) :: {:ok, executable()} | error()
  def compile(server, mlir, opts \\ []) do
    spec = [timeout: :timeout, telemetry_metadata: :map]

    spec =
      if XlaNode.Pool.pool?(server),
        do: [{:node, :name} | spec],
        else: [{:devices, :integers} | spec]

    opts = Options.validate!(opts, "XlaNode.compile/3", spec)
    mlir = IO.iodata_to_binary(mlir)
    # A pool's node: chooses where it compiles first.
    request =
      case Keyword.take(opts, [:node, :devices]) do
        [] -> {:compile, mlir}
        node_opts -> {:compile, mlir, node_opts}
      end

    metadata = telemetry_metadata(server, opts, %{})

    Telemetry.span(:compile, metadata, fn ->
      result = call(server, request, Keyword.get(opts, :timeout, :infinity))
      exe = if match?({:ok, _}, result), do: elem(result, 1)
      {result, metadata |> Map.put(:exe, exe) |> Telemetry.stop_metadata(result)}
    end)
  end

  @doc """
  Like `compile/3` but returns the executable or raises `XlaNode.Error`.

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"
      exe = XlaNode.compile!(:"xla@host", mlir)
      true = is_reference(exe)

      kind =
        try do
          XlaNode.compile!(:"xla@host", "nonsense")
        rescue
          error in XlaNode.Error -> error.kind
        end

      kind
      #=> :compile_error
  """
  @spec compile!(server(), iodata(), keyword()) :: executable()
  def compile!(server, mlir, opts \\ []), do: bang(compile(server, mlir, opts))

  @doc """
  Runs an executable.

  `args` are tensors (`{binary, {type, dims}}`) or device buffers, one per parameter of the
  program. Returns the results in order: tensors, or buffer references for the results kept on
  the device (`:keep_on_device`). Tensors among `args` that take more than one message in all
  are placed on the device first, in chunks (see `XlaNode.Transfer`), and freed once the run is
  answered: a run never sends a message over the node's limit.

  Options:

    * `:device` - the device to run on, an index into `info/2`'s `devices` (default: the device
      of the buffers among `args`, else 0; through an `XlaNode.Pool`, else the device the pool
      chooses). Tensors among `args` are copied there; a buffer on another device is refused
      with an `XlaNode.Error` of kind `:argument_error` that names both devices (the node never
      moves buffers between devices). Results kept on the device stay on the run's device
    * `:keep_on_device` - `true`: leave every result on the device and return buffers; a list
      of result indices (distinct, from 0): keep those, return the others as tensors, in the same
      reply (a training step's new parameters stay, its loss comes back); `false` (the default):
      return tensors. The node answers `:argument_error` for an index the program has no result
      for
    * `:wait` - `true`: answer only once the run has completed. By default a run whose results
      all stay on the device, of a program without host callbacks, is answered as soon as the
      node has launched it; its buffers carry their readiness, so the next read or run that uses
      one waits for it, and an error XLA reports at completion comes back there (default
      `false`)
    * `:callback_server` - the process that serves the program's host callbacks, usually an
      `XlaNode.CallbackServer`: a pid, `{name, node}`, or a bare atom, which is taken as a name
      registered on *this* node (`{name, node()}`). The node supplies the callback handle
      parameter itself, so `args` leave it out.
    * `:callback_timeout` - how long the node waits for each callback reply, in milliseconds
      (positive) or `:infinity` (default: the node's `--callback-timeout`)
    * `:queue_timeout` - how long the run may wait for a place when the node already executes as
      many runs as it admits at once, in milliseconds or `:infinity` (default: the node's
      `--queue-timeout`); past it the run fails with an `XlaNode.Error` of kind `:timeout`
    * `:priority` - `:high`, `:normal` (the default) or `:low`: among the runs of this node
      (the BEAM node of the calling process) waiting for a place on the compute node, a `:high`
      run goes before every `:normal` one and a `:normal` before every `:low`; runs of other
      nodes keep their share whatever the priority (see the node's README, "Several client
      nodes")
    * `:timeout` - how long to wait for the result, in milliseconds or `:infinity` (default
      `:infinity`)
    * `:telemetry_metadata` - a map added to the metadata of the call's `:telemetry` events
      (see `XlaNode.Telemetry`)
    * `:owner` - the process that holds the results kept on the device (default: the caller);
      they are freed when it exits. `XlaNode.Keeper.owner/0` is the process that keeps buffers
      while their tokens are held

  With an `XlaNode.Pool` (see its documentation), also:

    * `:node` - run it on this node of the pool, and nowhere else
    * `:retry` - `false`: never re-send the run to another node when its node goes down
      (default `true`)
    * `:max_attempts` - how many nodes may try the run, the first included (default: the pool's
      `:max_attempts`)

  ## Examples

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"
      exe = XlaNode.compile!(:"xla@host", mlir)
      x = XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})
      {:ok, [y]} = XlaNode.run(:"xla@host", exe, [x])
      XlaNode.Tensor.to_list(y)
      #=> [2.0, 3.0, 4.0, 5.0]

      # The result stays on the node, and is the next run's argument.
      {:ok, [buf]} = XlaNode.run(:"xla@host", exe, [x], keep_on_device: true)
      {:ok, [z]} = XlaNode.run(:"xla@host", exe, [buf])
      XlaNode.Tensor.to_list(z)
      #=> [3.0, 4.0, 5.0, 6.0]

  A step that updates its parameter and reports a loss: the new parameter (result 0) stays
  on the node, the loss (result 1) comes back.

      step = \"\"\"
      func.func @main(%w: tensor<4xf32>, %g: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {
        %w1 = stablehlo.subtract %w, %g : tensor<4xf32>
        %zero = stablehlo.constant dense<0.0> : tensor<f32>
        %loss = stablehlo.reduce(%w1 init: %zero) applies stablehlo.add across dimensions = [0]
          : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
        return %w1, %loss : tensor<4xf32>, tensor<f32>
      }
      \"\"\"
      step = XlaNode.compile!(:"xla@host", step)
      {:ok, w} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32}))
      g = XlaNode.Tensor.from_list([0.5, 0.5, 0.5, 0.5], {:f, 32})
      {:ok, [w, loss]} = XlaNode.run(:"xla@host", step, [w, g], keep_on_device: [0])
      true = is_reference(w)
      XlaNode.Tensor.to_list(loss)
      #=> 8.0
  """
  @spec run(server(), executable(), [tensor() | buffer()], keyword()) ::
          {:ok, [tensor() | buffer()]} | error()
  def run(server, exe, args, opts \\ []) when is_list(args) do
    opts = Options.validate!(opts, "XlaNode.run/4", run_options(server))
    {timeout, node_opts} = Keyword.pop(opts, :timeout, :infinity)
    node_opts = Keyword.delete(node_opts, :telemetry_metadata)

    node_opts =
      Enum.map(node_opts, fn
        {:callback_server, name} when is_atom(name) and name != nil ->
          {:callback_server, {name, node()}}

        other ->
          other
      end)

    request = if node_opts == [], do: {:run, exe, args}, else: {:run, exe, args, node_opts}
    metadata = telemetry_metadata(server, opts, %{exe: exe})

    Telemetry.span(:run, metadata, fn ->
      {result, where} = call_run(server, request, timeout)
      {result, metadata |> Map.merge(where) |> Telemetry.stop_metadata(result)}
    end)
  end

  @doc """
  Like `run/4` but returns the list of results or raises `XlaNode.Error`.

      mlir = \"\"\"
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %one = stablehlo.constant dense<1.0> : tensor<4xf32>
        %r = stablehlo.add %x, %one : tensor<4xf32>
        return %r : tensor<4xf32>
      }
      \"\"\"
      exe = XlaNode.compile!(:"xla@host", mlir)
      [y] = XlaNode.run!(:"xla@host", exe, [XlaNode.Tensor.from_list([1.0, 2.0, 3.0, 4.0], {:f, 32})])
      XlaNode.Tensor.to_list(y)
      #=> [2.0, 3.0, 4.0, 5.0]
  """
  @spec run!(server(), executable(), [tensor() | buffer()], keyword()) :: [tensor() | buffer()]
  def run!(server, exe, args, opts \\ []), do: bang(run(server, exe, args, opts))

  @doc """
  Copies a tensor to the device and returns a buffer reference, usable as a `run/4` argument.

  A tensor of any size: one larger than 32 MiB (or than the node's message limit allows) goes
  in chunks, each its own message (see `XlaNode.Transfer`). Options: `:timeout` (default
  `60_000`, for each of its calls); `:device`, the device the buffer lives on, an index into
  `info/2`'s `devices` (default 0; through an `XlaNode.Pool`, the least loaded device of the
  node it chooses): a run with it runs there; `:owner`, the process that holds the buffer
  (default: the caller).

      {:ok, buf} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      {:ok, %{shape: {{:s, 64}, [2]}, device: 0}} = XlaNode.describe(:"xla@host", buf)

      # On a node with several devices (--pjrt-option cpu_device_count=4 for XLA's CPU):
      {:ok, on_2} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}), device: 2)
      {:ok, %{device: 2}} = XlaNode.describe(:"xla@host", on_2)
  """
  @spec to_device(server(), tensor(), keyword()) :: {:ok, buffer()} | error()
  def to_device(server, tensor, opts \\ []) do
    opts =
      Options.validate!(opts, "XlaNode.to_device/3",
        timeout: :timeout,
        device: :non_neg_integer,
        owner: :pid
      )

    request =
      case Keyword.take(opts, [:device, :owner]) do
        [] -> {:to_device, tensor}
        placement -> {:to_device, tensor, placement}
      end

    call(server, request, Keyword.get(opts, :timeout, @default_timeout))
  end

  @doc """
  Like `to_device/3` but returns the buffer or raises `XlaNode.Error`.

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.scalar(1.0, {:f, 32}))
      true = is_reference(buf)
  """
  @spec to_device!(server(), tensor(), keyword()) :: buffer()
  def to_device!(server, tensor, opts \\ []), do: bang(to_device(server, tensor, opts))

  @doc """
  Reads a device buffer back as a tensor.

  A tensor of any size: one larger than a chunk comes back in chunks (see `XlaNode.Transfer`).
  Options: `:timeout` (default `60_000`).

      {:ok, buf} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      {:ok, tensor} = XlaNode.read(:"xla@host", buf)
      XlaNode.Tensor.to_list(tensor)
      #=> [1, 2]
  """
  @spec read(server(), buffer(), keyword()) :: {:ok, tensor()} | error()
  def read(server, buffer, opts \\ []),
    do: call(server, {:read, buffer}, timeout!(opts, "XlaNode.read/3"))

  @doc """
  Like `read/3` but returns the tensor or raises `XlaNode.Error`.

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      [1, 2] = buf |> then(&XlaNode.read!(:"xla@host", &1)) |> XlaNode.Tensor.to_list()
  """
  @spec read!(server(), buffer(), keyword()) :: tensor()
  def read!(server, buffer, opts \\ []), do: bang(read(server, buffer, opts))

  @doc """
  Frees an executable or a buffer now, whoever holds it, instead of when its last holder exits.

  Options: `:timeout` (default `60_000`).

      {:ok, buf} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      :ok = XlaNode.free(:"xla@host", buf)
      {:error, %XlaNode.Error{kind: :argument_error}} = XlaNode.free(:"xla@host", buf)
  """
  @spec free(server(), executable() | buffer(), keyword()) :: :ok | error()
  def free(server, ref, opts \\ []) do
    case call(server, {:free, ref}, timeout!(opts, "XlaNode.free/3")) do
      {:ok, :ok} ->
        if is_reference(ref), do: XlaNode.Keeper.freed([ref])
        :ok

      {:error, _} = error ->
        error
    end
  end

  @doc """
  Frees many executables and buffers, on whichever nodes hold them, with one message to each
  node and no answer to wait for (a `GenServer.cast` of `{:free, refs}`). The node frees them in
  order with the requests around them; references it has not got (freed already, or never its
  own) are skipped. The frees this process noted with `free_later/1` go in the same casts.
  Always `:ok`.

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      exe = XlaNode.compile!(:"xla@host", "func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }")
      :ok = XlaNode.free_all([buf, exe])
  """
  @spec free_all([reference()]) :: :ok
  def free_all(refs) when is_list(refs) do
    for ref <- refs, not is_reference(ref) do
      raise ArgumentError,
            "XlaNode.free_all/1 takes the references of a node's executables and buffers " <>
              "(free a pool's executable with free/3), got: #{inspect(ref)}"
    end

    XlaNode.Frees.cast_frees(refs ++ XlaNode.Frees.take())
  end

  @doc """
  Frees an executable or a buffer with no message of its own: the free goes to its node with
  this process's next request (any function of this module, in one `{:free, refs}` cast with
  every other free noted meanwhile, sent just before the request), or about a millisecond
  later if it sends none by then, or when this process exits. For code that frees tensor by
  tensor, as `Nx.backend_deallocate/1` does, where `free_all/1` cannot gather them: freeing a
  step's old params this way costs the step one message, however many there are.

  Returns `:ok`, or `:already_noted` when this process noted `ref` already (among the last
  1024 it noted). As with `free_all/1`, a reference the node has not got is skipped. Another
  process may see the buffer on the node until the free leaves.

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      :ok = XlaNode.free_later(buf)
      :already_noted = XlaNode.free_later(buf)
      # Freed on the node before this ping, in the same message stream.
      :pong = XlaNode.ping(:"xla@host")
  """
  @spec free_later(executable() | buffer()) :: :ok | :already_noted
  def free_later(ref) when is_reference(ref), do: XlaNode.Frees.note(ref)

  def free_later(other) do
    raise ArgumentError,
          "XlaNode.free_later/1 takes the reference of a node's executable or buffer, got: " <>
            inspect(other)
  end

  @doc """
  Like `free/3` but returns `:ok` or raises `XlaNode.Error`.

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      :ok = XlaNode.free!(:"xla@host", buf)
  """
  @spec free!(server(), executable() | buffer(), keyword()) :: :ok
  def free!(server, ref, opts \\ []) do
    case free(server, ref, opts) do
      :ok -> :ok
      {:error, error} -> raise error
    end
  end

  @doc """
  Hands one of this process's holds on a buffer or an executable (or on each of a list of
  them) to the process `pid`, as `:ets.give_away/3` hands a table: the node then frees it when
  `pid` exits (or releases it), not when this process does. Every one is handed over, or none: `{:error, %XlaNode.Error{kind:
  :argument_error}}` names the first that this process does not hold (or that names nothing).
  Through an `XlaNode.Pool`, each node's buffers go to their node (the references name it).

  Options: `:timeout` (default `60_000`).

      tensor = XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32})
      {:ok, buf} = XlaNode.to_device(:"xla@host", tensor)
      parent = self()

      worker =
        spawn(fn ->
          receive do
            {:buffer, buf} -> send(parent, {:read, XlaNode.read!(:"xla@host", buf)})
          end
        end)

      :ok = XlaNode.give_away(:"xla@host", buf, worker)
      send(worker, {:buffer, buf})
      receive do {:read, read} -> read end
      #=> {<<0, 0, 128, 63, 0, 0, 0, 64>>, {{:f, 32}, [2]}}
  """
  @spec give_away(server(), reference() | [reference()], pid(), keyword()) :: :ok | error()
  def give_away(server, refs, pid, opts \\ []) when is_pid(pid),
    do: hold_request(server, {:give_away, refs!(refs, "give_away/4"), pid}, opts, "give_away/4")

  @doc """
  Like `give_away/4` but returns `:ok` or raises `XlaNode.Error`.
  """
  @spec give_away!(server(), reference() | [reference()], pid(), keyword()) :: :ok
  def give_away!(server, refs, pid, opts \\ []), do: ok!(give_away(server, refs, pid, opts))

  @doc """
  Gives the process `pid` one more hold on a buffer or an executable (or on each of a list of
  them): the node frees it once no hold is left, every holder having exited or released its
  holds (or at once with `free/3`). Holds are counted, as references are: `pid` holds it twice
  after two shares. Every one is shared, or none (`:argument_error` naming the first reference
  that names nothing). Options: `:timeout` (default `60_000`).

      w = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32}))
      b = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([0.5], {:f, 32}))
      worker = spawn(fn -> Process.sleep(:infinity) end)
      :ok = XlaNode.share(:"xla@host", [w, b], worker)
  """
  @spec share(server(), reference() | [reference()], pid(), keyword()) :: :ok | error()
  def share(server, refs, pid, opts \\ []) when is_pid(pid),
    do: hold_request(server, {:share, refs!(refs, "share/4"), pid}, opts, "share/4")

  @doc """
  Like `share/4` but returns `:ok` or raises `XlaNode.Error`.
  """
  @spec share!(server(), reference() | [reference()], pid(), keyword()) :: :ok
  def share!(server, refs, pid, opts \\ []), do: ok!(share(server, refs, pid, opts))

  @doc """
  Ends one of this process's holds on a buffer or an executable (or on each of a list of
  them): the node frees one when no hold on it is left. Every hold ends, or none
  (`:argument_error` naming the first reference this process does not hold). Options:
  `:timeout` (default `60_000`).

      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1, 2], {:s, 64}))
      worker = spawn(fn -> Process.sleep(:infinity) end)
      :ok = XlaNode.share(:"xla@host", buf, worker)
      :ok = XlaNode.release(:"xla@host", buf)
      # The worker's hold keeps it.
      {:ok, _} = XlaNode.read(:"xla@host", buf)
  """
  @spec release(server(), reference() | [reference()], keyword()) :: :ok | error()
  def release(server, refs, opts \\ []),
    do: hold_request(server, {:release, refs!(refs, "release/3")}, opts, "release/3")

  @doc """
  Like `release/3` but returns `:ok` or raises `XlaNode.Error`.
  """
  @spec release!(server(), reference() | [reference()], keyword()) :: :ok
  def release!(server, refs, opts \\ []), do: ok!(release(server, refs, opts))

  defp refs!(refs, function) do
    for ref <- List.wrap(refs), not is_reference(ref) do
      raise ArgumentError,
            "XlaNode.#{function} takes the references of a node's executables and buffers, " <>
              "got: #{inspect(ref)}"
    end

    refs
  end

  defp hold_request(server, request, opts, function) do
    case call(server, request, timeout!(opts, "XlaNode." <> function)) do
      {:ok, :ok} -> :ok
      {:ok, other} -> {:error, Error.from_reason(other)}
      {:error, _} = error -> error
    end
  end

  defp ok!(:ok), do: :ok
  defp ok!({:error, error}), do: raise(error)

  @doc """
  Checks that the node answers: `:pong`, or `{:error, %XlaNode.Error{}}`.

  Options: `:timeout` (default `60_000`).

      :pong = XlaNode.ping(:"xla@host")
      {:error, %XlaNode.Error{kind: :nodedown}} = XlaNode.ping(:"nobody@nowhere")
  """
  @spec ping(server(), keyword()) :: :pong | error()
  def ping(server, opts \\ []) do
    case call(server, :ping, timeout!(opts, "XlaNode.ping/2")) do
      {:ok, :pong} -> :pong
      {:ok, other} -> {:error, Error.from_reason(other)}
      {:error, _} = error -> error
    end
  end

  @doc """
  The node's status: a map with keys such as `:node`, `:version`, `:uptime_ms`, `:peers`,
  `:platform`, `:devices`, `:executables`, `:buffers`, `:compiles`, `:runs`, `:run_errors`, and
  `:tenants`, each client node's runs, queue wait, device memory and refusals (this node's under
  `node()`, once it has put a buffer, compiled a program or sent a run there).

  Options: `:timeout` (default `60_000`).

      {:ok, %{platform: "cpu", devices: [_ | _] = devices}} = XlaNode.info(:"xla@host")
      true = Enum.all?(devices, &is_binary/1)
      buf = XlaNode.to_device!(:"xla@host", XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32}))
      {:ok, %{tenants: tenants}} = XlaNode.info(:"xla@host")
      %{runs_queued: _, device_bytes: bytes, refusals: _} = tenants[node()]
      true = bytes >= 8
      :ok = XlaNode.free(:"xla@host", buf)
  """
  @spec info(server(), keyword()) :: {:ok, map()} | error()
  def info(server, opts \\ []), do: call(server, :info, timeout!(opts, "XlaNode.info/2"))

  @doc """
  What an executable takes and gives: `{:ok, %{parameters: [{type, dims}], results: [{type,
  dims}], devices: [i, ...]}}`. For a program compiled with `devices:` (see `compile/3`) the
  types are each device's shard, as `run/4` takes and returns them (the partitioner splits the
  results whose sharding the module leaves open), and `devices` lists its devices in order; a
  single-device program has `devices: []`. Of a buffer: `{:ok, %{shape: {type, dims}, device:
  n}}`, `n` the index in `info/2`'s `devices` of the device it lives on. Not with an
  `XlaNode.Pool`, whose executables live on several nodes.

  Options: `:timeout` (default `60_000`).

      {:ok, exe} = XlaNode.compile(:"xla@host", "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32> }")
      {:ok, %{parameters: [{{:f, 32}, [4]}], results: [{{:f, 32}, [4]}], devices: []}} =
        XlaNode.describe(:"xla@host", exe)

      {:ok, buf} = XlaNode.to_device(:"xla@host", XlaNode.Tensor.from_list([1.0, 2.0], {:f, 32}))
      {:ok, %{shape: {{:f, 32}, [2]}, device: 0}} = XlaNode.describe(:"xla@host", buf)

  A program split over two devices (of a node with several), each device's shard:

      mlir = \"\"\"
      module @split attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
        func.func @main(%x: tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"})
            -> (tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}) {
          %y = stablehlo.add %x, %x : tensor<4x2xf32>
          return %y : tensor<4x2xf32>
        }
      }
      \"\"\"
      {:ok, exe} = XlaNode.compile(:"xla@host", mlir, devices: [0, 1])
      {:ok, %{results: [{{:f, 32}, [2, 2]}], devices: [0, 1]}} = XlaNode.describe(:"xla@host", exe)
  """
  @spec describe(server(), executable() | buffer(), keyword()) :: {:ok, map()} | error()
  def describe(server, ref, opts \\ []) do
    timeout = timeout!(opts, "XlaNode.describe/3")

    if XlaNode.Pool.pool?(server) do
      raise ArgumentError, "XlaNode.describe/3 takes a node, not an XlaNode.Pool"
    end

    call(server, {:describe, ref}, timeout)
  end

  @doc """
  Loads a native kernel on a running node: the XLA FFI handler that the shared library `path`
  exports as `symbol` then serves `stablehlo.custom_call @target(...)` in every program the node
  compiles, for every client. See [Native kernels](kernels.md) for writing and building one.

  The node must have been started with `--kernel-dir DIR`, and `path` must lie under such a
  directory (a relative `path` is taken relative to it); otherwise the load is refused with an
  error of kind `:kernel_error` that names the flag. Loading the same `target`, `path` and
  `symbol` again returns `:ok`; a different handler for a target already taken is an error that
  names the library holding it. A kernel stays loaded until the node stops: XLA cannot unload
  one.

  Options:

    * `:version_shim` - a boolean: load a kernel built against a newer XLA FFI than the node's
      XLA speaks (for instance jaxlib 0.9 headers, FFI 0.3, on an FFI 0.2 node) by answering its
      version query in its place. Safe only for kernels without FFI state. Default: as the
      node's `--kernel-version-shim` says (off).
    * `:timeout` - milliseconds or `:infinity` (default `60_000`)

  For example, on a node started with `--kernel-dir /opt/kernels`:

      :ok = XlaNode.load_kernel(:"xla@host", "my_add_scaled", "libmy_kernels.so", "AddScaled")
      # Again: the same kernel, already loaded.
      :ok = XlaNode.load_kernel(:"xla@host", "my_add_scaled", "libmy_kernels.so", "AddScaled")

      {:error, %XlaNode.Error{kind: :kernel_error, message: message}} =
        XlaNode.load_kernel(:"xla@host", "my_op", "/elsewhere/libnew.so", "MyOp")
      message =~ "no such library: /elsewhere/libnew.so"
      #=> true
  """
  @spec load_kernel(server(), String.t() | atom(), Path.t(), String.t() | atom(), keyword()) ::
          :ok | error()
  def load_kernel(server, target, path, symbol, opts \\ []) do
    opts =
      Options.validate!(opts, "XlaNode.load_kernel/5", version_shim: :boolean, timeout: :timeout)

    with :ok <- check_name(:target, target),
         :ok <- check_name(:symbol, symbol),
         :ok <- check_path(path) do
      request =
        {:load_kernel, to_string(target), IO.chardata_to_string(path), to_string(symbol),
         Keyword.take(opts, [:version_shim])}

      case call(server, request, Keyword.get(opts, :timeout, @default_timeout)) do
        {:ok, :ok} -> :ok
        {:ok, other} -> {:error, Error.from_reason(other)}
        {:error, _} = error -> error
      end
    end
  end

  @doc """
  Like `load_kernel/5` but returns `:ok` or raises `XlaNode.Error`.

      :ok = XlaNode.load_kernel!(:"xla@host", "my_add_scaled", "libmy_kernels.so", "AddScaled")
  """
  @spec load_kernel!(server(), String.t() | atom(), Path.t(), String.t() | atom(), keyword()) ::
          :ok
  def load_kernel!(server, target, path, symbol, opts \\ []) do
    case load_kernel(server, target, path, symbol, opts) do
      :ok -> :ok
      {:error, error} -> raise error
    end
  end

  @doc """
  The `GenServer` server term a `server` argument stands for.

      iex> XlaNode.server(:"xla@host")
      {:xla, :"xla@host"}
      iex> XlaNode.server({:xla, :"xla@host"})
      {:xla, :"xla@host"}
  """
  @spec server(server()) :: GenServer.server()
  def server(node) when is_atom(node) and node != nil,
    do: {:xla, XlaNode.Local.whereis_node(node) || node}

  def server(server), do: server

  ## Internals

  # The metadata of a call's telemetry events: where it goes, what the call adds, and the
  # caller's own.
  defp telemetry_metadata(server, opts, own) do
    # A pool picks the node per call: the call itself names none.
    {node, target} =
      case XlaNode.Pool.route(server, nil) do
        {:pool, _} -> {nil, server}
        {:node, node} -> {Telemetry.node_of(server(node)), server(node)}
        {:error, _} -> {nil, server}
      end

    %{node: node, server: target}
    |> Map.merge(own)
    |> Map.merge(Keyword.get(opts, :telemetry_metadata, %{}))
  end

  # The :timeout of a function whose only option it is.
  defp timeout!(opts, function) do
    opts
    |> Options.validate!(function, timeout: :timeout)
    |> Keyword.get(:timeout, @default_timeout)
  end

  defp run_options(server) do
    if XlaNode.Pool.pool?(server), do: @run_options ++ @pool_run_options, else: @run_options
  end

  # Makes the call and normalises the reply to {:ok, value} | {:error, %Error{}}. Requests that
  # reply with a bare value (:ping, :free) come back as {:ok, value}. A pool serves the request
  # itself (see XlaNode.Pool).
  # Each request first sends the frees this process noted (`free_later/1`), so that the node
  # frees them in order with it.
  defp call(server, request, timeout) do
    XlaNode.Frees.send_noted()

    case XlaNode.Pool.route(server, request) do
      {:node, node} -> call_node(node, request, timeout)
      {:pool, pool} -> XlaNode.Pool.request(pool, request, timeout)
      {:error, _} = error -> error
    end
  end

  # A run, with where it went for its telemetry: `attempts` (how many nodes it was sent to) and,
  # through a pool, the `node` of its last attempt.
  defp call_run(server, request, timeout) do
    XlaNode.Frees.send_noted()

    case XlaNode.Pool.route(server, request) do
      {:node, node} -> {call_node(node, request, timeout), %{attempts: 1}}
      {:pool, pool} -> XlaNode.Pool.run(pool, request, timeout)
      {:error, _} = error -> {error, %{attempts: 0}}
    end
  end

  @doc false
  # The call to one node (or any other `server` but a pool), its reply normalised; what an
  # `XlaNode.Pool` sends each request it places with.
  def call_node(server, request, timeout) do
    target = server(server)

    try do
      XlaNode.Transfer.call(target, request, timeout)
    catch
      :exit, reason -> {:error, Error.from_exit(reason, target)}
    else
      {:ok, value} -> {:ok, value}
      {:error, reason} -> {:error, Error.from_reason(reason)}
      other -> {:ok, other}
    end
  end

  defp check_name(_what, name) when (is_binary(name) and name != "") or is_atom(name),
    do: :ok

  defp check_name(what, name),
    do:
      {:error,
       Error.argument_error(
         "the kernel #{what} must be a non-empty string, got: #{inspect(name)}"
       )}

  defp check_path(path) when is_binary(path) or is_list(path) do
    if IO.chardata_to_string(path) != "",
      do: :ok,
      else: {:error, Error.argument_error("the kernel path must not be empty")}
  rescue
    ArgumentError ->
      {:error, Error.argument_error("the kernel path must be a string, got: #{inspect(path)}")}
  end

  defp check_path(path),
    do: {:error, Error.argument_error("the kernel path must be a string, got: #{inspect(path)}")}

  defp bang({:ok, value}), do: value
  defp bang({:error, %Error{} = error}), do: raise(error)
end
