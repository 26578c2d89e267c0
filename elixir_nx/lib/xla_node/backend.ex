defmodule XlaNode.Backend do
  @moduledoc """
  An `Nx.Backend` whose tensors live on an xla_node compute node, as `EXLA.Backend`'s live on
  a device: creating a tensor places it on the node, every operation runs there, and results
  stay there until read.

      Nx.default_backend({XlaNode.Backend, node: :"xla@host"})
      t = Nx.iota({3, 3}, type: :f32)
      t |> Nx.add(1) |> Nx.sum(axes: [1]) |> Nx.to_flat_list()
      #=> [6.0, 15.0, 24.0]

  or, for the whole application, in `config/config.exs`:

      # config/config.exs
      config :nx, default_backend: {XlaNode.Backend, node: :"xla@host"}
      config :nx, default_defn_options: [compiler: XlaNode.Compiler, node: :"xla@host"]

  ## Options

    * `:node` - the compute node (required), or an `XlaNode.Pool` (its name or pid): tensors
      are then placed on a node the pool chooses, and each operation runs on the node holding
      its tensors (a tensor on another node of the pool is sent along, as between two nodes)

    * `:priority` - `:high`, `:normal` (the default) or `:low`: the priority of the eager
      operations of a process whose default backend has it, among the runs of its BEAM node
      waiting on the compute node (see `XlaNode.run/4`), e.g.
      `Nx.default_backend({XlaNode.Backend, node: node, priority: :low})` in a batch job

  Other options are ignored, as `EXLA.Backend` ignores those it does not know.

  ## Operations

  Each operation runs as a program on the node: `XlaNode.Compiler` compiles the one `Nx.Defn.Expr`
  call the operation stands for, once per (operation, options, types and shapes) and node, and
  from then on an operation is one request to the node, with no tensor data crossing. Scalars made from numbers (`Nx.add(t, 1)`, `Nx.tensor(1.0)`) are the
  exception: they stay in the tensor struct and go, a few bytes, with the operation that uses
  them.

  Every Nx type moves to and from the node, and operations run on every one of them, the
  2- and 4-bit integers and the 8-bit floats included (see `XlaNode.Compiler` for how they
  compute).

  A tensor of this backend passed to a function jitted with `XlaNode.Compiler` on the same node
  goes as its buffer, and the function's results stay on the node when the default backend is
  `XlaNode.Backend` (or with `keep_on_device: true`): a training loop keeps its parameters on
  the node from step to step.

  `Nx.to_binary/1`, `Nx.to_number/1`, `inspect/2` and `Nx.backend_transfer/2` to another backend
  read the data back; `Nx.backend_transfer/2` to `{XlaNode.Backend, node: other}` moves it to
  another node (through this one), freeing it on the first, and `Nx.backend_copy/2` does the same
  without freeing.

  ## Tensors of two nodes in one operation

  An operation runs on the node of its first tensor argument with data on a node; the tensors of
  other nodes are read from theirs and sent along, through this node (as `Nx.backend_copy/2`
  would). It works, at the cost of moving those tensors; move them once with
  `Nx.backend_transfer/2` when they are used more than once.

  ## Memory

  A tensor lives while any process holds it, as an EXLA tensor does: its buffer is freed on
  the node soon after the last process holding the tensor drops it and collects its garbage
  (`XlaNode.Keeper` holds every buffer on its node and watches the tensor's token, a small
  binary the tensor holds). A Task's result, a tensor sent to another process, kept in an
  `Agent`, a GenServer's state or an ETS table lives as long as they hold it; what a
  long-lived process drops goes without anything else to do. A tensor sent to a process on
  another node of the cluster lives there from the first time that process uses it (its
  node's client takes it over then), until no node holds it; `hand_over/2` makes it live
  there from before it is sent, so that the sender may drop it at once.

  To free at once rather than when the garbage is collected: `Nx.backend_deallocate/1` (sent
  with this process's next request to the node, or a millisecond later:
  `XlaNode.free_later/1`), `free_all/1` (a container's tensors, one cast), or `scope/1`, which
  frees what this process made inside it when it ends, except what it returns:

      Nx.default_backend({XlaNode.Backend, node: :"xla@host"})
      params = Nx.tensor([1.0, 2.0, 3.0])
      grads = Nx.tensor([0.5, 0.5, 0.5])

      # The temporaries (the scaled gradient) are freed; the new params stay.
      params =
        XlaNode.Backend.scope(fn ->
          step = Nx.multiply(grads, 0.1)
          Nx.subtract(params, step)
        end)

      Nx.to_flat_list(params)
      #=> [0.949999988079071, 1.9500000476837158, 2.950000047683716]

  Each frees the buffer whoever else holds the tensor, as `Nx.backend_deallocate/1` does on
  EXLA.

  ## Errors

  A node that is down, or goes down during an operation, raises an `XlaNode.Error` of kind
  `:nodedown` naming it; its tensors are gone (the node frees a client node's buffers when
  the connection to it drops). A tensor whose buffer the node no longer has (freed, no process
  held it any more, the node restarted) raises an `XlaNode.Error` of kind `:gone` that names
  its node. A tensor whose data was tampered with (its token not one `XlaNode.Keeper` made)
  raises `ArgumentError`.

  Pointers (`Nx.to_pointer/2`, `Nx.from_pointer/5`) raise: the data is in another OS process,
  possibly on another machine.
  """

  @behaviour Nx.Backend

  @enforce_keys [:node, :buffer]
  defstruct [:node, :buffer, :token]

  @typedoc """
  A tensor's data: its `node`, and its `buffer` there (a reference held by `XlaNode.Keeper`)
  with the `token` that keeps it alive while any process holds the tensor, or `{:inline,
  binary}` (and no token) for a scalar made from a number or a small result, kept here.
  """
  @type t :: %__MODULE__{
          node: node() | XlaNode.Pool.t(),
          buffer: reference() | {:inline, binary()},
          token: XlaNode.Keeper.token() | nil
        }

  alias XlaNode.Backend.{Eager, Scope, Transfer}

  # Data bigger than this is sliced on the node before `Nx.to_binary/2` with a limit reads it.
  @read_whole_up_to 65_536

  @doc """
  Runs `fun` and frees every buffer the calling process made on a node meanwhile, except the
  ones the result holds (however nested: tuples, lists, maps, structs); returns the result.
  When `fun` raises, throws or exits, everything it made is freed. Scopes nest: what an inner
  scope returns belongs to the outer one.

  Buffers other processes make (a `Task` started inside) are not this scope's: they live
  while some process holds them.

      Nx.default_backend({XlaNode.Backend, node: :"xla@host"})
      {x, w, y} = {Nx.tensor([1.0, 2.0, 3.0]), Nx.tensor(2.0), Nx.tensor([1.0, 3.0, 5.0])}

      loss =
        XlaNode.Backend.scope(fn ->
          x |> Nx.multiply(w) |> Nx.subtract(y) |> Nx.pow(2) |> Nx.mean()
        end)

      Nx.to_number(loss)
      #=> 1.0
  """
  @spec scope((-> result)) :: result when result: term()
  def scope(fun), do: Scope.run(fun)

  @doc """
  Frees the buffers of every `XlaNode.Backend` tensor inside `term` (a tensor, or a container
  however nested: a model's params), with one `{:free, buffers}` cast to each node that holds
  some and no answer to wait for; returns `:ok`. Buffers freed already are skipped silently.

  `Nx.backend_deallocate/1` of a container comes to the same: Nx frees it tensor by tensor, and
  each free is noted to go with this process's next request to the node (`XlaNode.free_later/1`),
  in one cast with the others. Either way a training loop that drops its old params each step
  pays one message for it:

      Nx.default_backend({XlaNode.Backend, node: :"xla@host"})
      params = %{w: Nx.tensor([1.0, 2.0]), b: Nx.tensor(0.5)}
      {x, y} = {Nx.tensor([1.0, 1.0]), Nx.tensor(4.0)}

      step =
        Nx.Defn.jit(
          fn params, x, y ->
            loss = x |> Nx.dot(params.w) |> Nx.add(params.b) |> Nx.subtract(y) |> Nx.pow(2)
            {%{params | w: Nx.subtract(params.w, x)}, loss}
          end,
          compiler: XlaNode.Compiler,
          node: :"xla@host"
        )

      {new_params, loss} = XlaNode.Backend.scope(fn -> step.(params, x, y) end)
      :ok = XlaNode.Backend.free_all(params)
      Nx.to_flat_list(new_params.w)
      #=> [0.0, 1.0]
      Nx.to_number(loss)
      #=> 0.25
  """
  @spec free_all(term()) :: :ok
  def free_all(term), do: term |> Scope.buffers() |> Scope.free()

  @doc """
  Hands the tensors inside `term` (a tensor, or a container however nested) to `pid`, a
  process of another node of the cluster, before this process sends them there; returns
  `term`, so that it fits in the message:

      Nx.default_backend({XlaNode.Backend, node: :"xla@host"})
      params = %{w: Nx.iota({4, 4}, type: :f32), b: Nx.iota({4}, type: :f32)}

      # A process of another node of the cluster, running the client, that keeps what it gets.
      pid = Node.spawn(:"client@host", fn -> receive do: ({:params, _} -> Process.sleep(:infinity)) end)

      send(pid, {:params, XlaNode.Backend.hand_over(params, pid)})
      # This process may drop `params` now: `pid`'s node holds them.

  A tensor sent to another node lives there from the first time a process of that node uses
  it (its node's client takes it over then); until then, only the node it came from holds
  it. After `hand_over/2` it lives until a process of `pid`'s node first uses it, and from
  then while any process there holds it, whatever this node does; a tensor `pid` never uses
  goes when `pid` exits. It returns once `pid`'s node holds the buffers: one round trip to
  that node, and one from there to the compute node. A no-op for a `pid` of this node,
  whose processes hold what they are sent already, and for tensors that are not on a node.

  Raises `XlaNode.Error`: `:noproc` when `pid`'s node does not run the client's application
  (`:xla_node_client`, whose `XlaNode.Keeper` holds its processes' tensors), `:nodedown`,
  `:timeout` (after `:timeout`, 60 s by default).
  """
  @spec hand_over(term, pid(), keyword()) :: term when term: term()
  def hand_over(term, pid, opts \\ []) when is_pid(pid) and is_list(opts) do
    timeout = Keyword.get(opts, :timeout, 60_000)

    if node(pid) != node() do
      case XlaNode.Keeper.hand_over(Scope.tokens(term), pid, timeout) do
        :ok -> :ok
        {:error, error} -> raise error
      end
    end

    term
  end

  @impl true
  def init(opts) do
    node!(opts)
    opts
  end

  # `backend: {XlaNode.Backend, opts}` on a creation function reaches the callback without
  # `init/1`: the node is checked where it is used. Other options are ignored, as EXLA.Backend
  # ignores those it does not know.
  defp node!(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "XlaNode.Backend: options must be a keyword list, got: #{inspect(opts)}"
    end

    case opts[:node] do
      # The name of an XlaNode.Local stands for its node of the moment.
      node when is_atom(node) and node != nil ->
        XlaNode.Local.resolve(node)

      pool when is_pid(pool) ->
        pool

      nil ->
        raise ArgumentError,
              "XlaNode.Backend needs the compute node: {XlaNode.Backend, node: :\"xla@host\"}"

      other ->
        raise ArgumentError,
              "XlaNode.Backend: :node must be a node name (an atom) or an XlaNode.Pool, " <>
                "got #{inspect(other)}"
    end
  end

  ## Creation

  @impl true
  def from_binary(out, binary, opts),
    do: Transfer.place!(out, node!(opts), binary, placement(opts))

  # `device_id: n` places tensors that come from the host on that device of the node.
  defp placement(opts) do
    case Keyword.fetch(opts, :device_id) do
      {:ok, device} when is_integer(device) and device >= 0 ->
        [device: device]

      {:ok, other} ->
        raise ArgumentError,
              "XlaNode.Backend: :device_id must be a device index (a non-negative integer), " <>
                "got #{inspect(other)}"

      :error ->
        []
    end
  end

  @impl true
  def constant(%Nx.Tensor{shape: {}} = out, number, opts) do
    binary = Nx.BinaryBackend.constant(out, number, []) |> Nx.to_binary()
    %{out | data: %__MODULE__{node: node!(opts), buffer: {:inline, binary}}}
  end

  # A larger one is its scalar broadcast on the node: no data crosses.
  def constant(out, number, opts) do
    scalar = constant(%{out | shape: {}, names: []}, number, opts)
    Eager.run(:broadcast, out, [scalar, out.shape, []])
  end

  @impl true
  def eye(out, opts), do: Eager.run(:eye, out, [opts], node!(opts))

  @impl true
  def iota(out, axis, opts), do: Eager.run(:iota, out, [axis, opts], node!(opts))

  ## Reading, moving, freeing

  @impl true
  def to_binary(%Nx.Tensor{type: {_, bits}} = t, limit) do
    # The data holds every entry of a vectorized tensor.
    t = Nx.devectorize(t, keep_names: false)

    binary =
      if limit < Nx.size(t) and Nx.byte_size(t) > @read_whole_up_to,
        do: read_head(t, limit),
        else: Transfer.read!(t)

    head_bits = min(limit, Nx.size(t)) * bits
    <<head::bitstring-size(head_bits), _::bitstring>> = binary
    head
  end

  # Only the first `limit` elements cross: a program on the node slices them off.
  defp read_head(t, limit) do
    out = %{t | shape: {limit}, names: [nil]}

    head =
      Eager.run(:head, out, [t, limit], nil, fn [t, n] ->
        t |> Nx.flatten() |> Nx.slice([0], [n])
      end)

    try do
      Transfer.read!(head)
    after
      Transfer.free(head)
    end
  end

  @impl true
  def inspect(%Nx.Tensor{} = t, opts) do
    size = t |> Nx.devectorize() |> Nx.size()
    limit = if opts.limit == :infinity, do: size, else: min(opts.limit + 1, size)
    Nx.Backend.inspect(t, to_binary(t, limit), opts)
  end

  @impl true
  def backend_copy(%Nx.Tensor{data: %__MODULE__{}} = t, __MODULE__, opts) do
    node = node!(opts)

    case t.data do
      %{buffer: {:inline, _}} ->
        put_in(t.data.node, node)

      # A copy on the node itself, on the tensor's own device: a program that returns its
      # argument. To a device named, through the host: the node does not move buffers.
      %{node: ^node} ->
        if Keyword.has_key?(opts, :device_id),
          do: Transfer.place!(t, node, Transfer.read!(t), placement(opts)),
          else: Eager.run(:copy, t, [t], node, fn [t] -> t end)

      _other_node ->
        Transfer.place!(t, node, Transfer.read!(t), placement(opts))
    end
  end

  def backend_copy(%Nx.Tensor{} = t, backend, opts) do
    backend = if backend == Nx.Tensor, do: Nx.BinaryBackend, else: backend
    backend.from_binary(t, Transfer.read!(t), opts)
  end

  @impl true
  def backend_transfer(%Nx.Tensor{data: %__MODULE__{node: node}} = t, backend, opts) do
    # The name of an XlaNode.Local stands for its node.
    same_node? = XlaNode.Local.resolve(opts[:node]) == node

    if backend == __MODULE__ and same_node? and not Keyword.has_key?(opts, :device_id) do
      Transfer.hold(t)
    else
      copy = backend_copy(t, backend, opts)
      Transfer.free(t)
      copy
    end
  end

  @impl true
  def backend_deallocate(%Nx.Tensor{} = t), do: Transfer.free(t)

  @impl true
  def to_batched(out, tensor, opts) do
    batch = elem(out.shape, 0)
    size = elem(tensor.shape, 0)
    full = div(size, batch)
    rest = rem(size, batch)

    full_batches = Stream.map(0..(full - 1)//1, &Nx.slice_along_axis(tensor, &1 * batch, batch))

    if rest != 0 and opts[:leftover] == :repeat do
      # The last batch wraps around to the first elements.
      last =
        Stream.map([full * batch], fn start ->
          Nx.concatenate([
            Nx.slice_along_axis(tensor, start, rest),
            Nx.slice_along_axis(tensor, 0, batch - rest)
          ])
        end)

      Stream.concat(full_batches, last)
    else
      full_batches
    end
  end

  @impl true
  def to_pointer(_tensor, _opts) do
    raise ArgumentError,
          "Nx.to_pointer/2 cannot work on XlaNode.Backend: the data is in the xla_node " <>
            "process, possibly on another machine. Nx.backend_transfer/2 it first"
  end

  @impl true
  def from_pointer(_pointer, _type, _shape, _backend_opts, _opts) do
    raise ArgumentError,
          "Nx.from_pointer/5 cannot make an XlaNode.Backend tensor: the node cannot reach " <>
            "this process's memory"
  end

  ## Operations

  # Start indices go as arguments, so that a slice is compiled once per shape, not once per
  # place (rows read one by one in a loop); Nx has checked integer ones against the shape.
  @impl true
  def slice(out, tensor, start_indices, lengths, strides) do
    Eager.run(:slice, out, [tensor, dynamic(start_indices), lengths, strides])
  end

  @impl true
  def put_slice(out, tensor, start_indices, slice) do
    Eager.run(:put_slice, out, [tensor, dynamic(start_indices), slice])
  end

  defp dynamic(indices) do
    Enum.map(indices, fn
      i when is_integer(i) -> Nx.tensor(i, type: :s64, backend: Nx.BinaryBackend)
      t -> t
    end)
  end

  @impl true
  def block(struct, output, args, fun) do
    Eager.run(:block, output, [struct, args, fun], nil, fn [struct, args, fun] ->
      Nx.Defn.Expr.block(struct, output, args, fun)
    end)
  end

  @direct [
    init: 1,
    from_binary: 3,
    constant: 3,
    eye: 2,
    iota: 3,
    to_binary: 2,
    inspect: 2,
    backend_copy: 3,
    backend_transfer: 3,
    backend_deallocate: 1,
    to_batched: 3,
    to_pointer: 2,
    from_pointer: 5,
    slice: 5,
    put_slice: 4,
    block: 4
  ]

  # Every other callback is an operation `(out, args...)` that Nx.Defn.Expr has too.
  for {name, arity} <- Nx.Backend.behaviour_info(:callbacks), {name, arity} not in @direct do
    [out | args] = Macro.generate_arguments(arity, __MODULE__)

    @impl true
    def unquote(name)(unquote(out), unquote_splicing(args)) do
      Eager.run(unquote(name), unquote(out), unquote(args))
    end
  end
end
