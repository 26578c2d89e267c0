defmodule XlaNode.Backend.Transfer do
  @moduledoc false

  # Data crossing between this node and a compute node, for `XlaNode.Backend` and
  # `XlaNode.Compiler`: placing a binary on a node, reading a buffer back, freeing it, passing a
  # tensor as a run argument, and turning a run's buffers into tensors.
  #
  # A tensor's `node` is what its backend options named: a node, or an `XlaNode.Pool`, which
  # sends reads, frees and runs taking the buffer to the node holding it. That node is the
  # buffer reference's own (`node/1`), which is how errors name it.
  #
  # Every buffer made here is held on its node by `XlaNode.Keeper` (`owner:` on the request that
  # makes it), and the tensor holds its token: it lives while any process holds the tensor.
  # Every tensor read or passed to a run is handed to `XlaNode.Keeper.hold/2` first, which takes
  # over one that came from another node. Every buffer made here is also noted in the open
  # `XlaNode.Backend.scope/1`, if any. A buffer the node no longer has (freed, the node
  # restarted) raises an `XlaNode.Error` of kind `:gone` naming the node; a node that is down or
  # unreachable, one of kind `:nodedown` that says its tensors are gone.

  alias XlaNode.Backend
  alias XlaNode.Backend.Scope

  @doc """
  Places `binary` (the data of `out`'s type and shape) on `node`, on the device `placement`'s
  `:device` names (`XlaNode.to_device/3`'s option): a tensor shaped as `out`.
  """
  def place!(out, node, binary, placement \\ []) do
    tensor = {binary, {out.type, Tuple.to_list(out.shape)}}

    case XlaNode.to_device(node, tensor, placement ++ owner()) do
      {:ok, buffer} -> wrap(out, node, buffer)
      {:error, error} -> raise error
    end
  end

  @doc """
  The option that makes `XlaNode.Keeper` hold what a request makes: `[owner: keeper]`, or `[]`
  when the client's application is not started (the caller holds it then).
  """
  def owner do
    case XlaNode.Keeper.owner() do
      nil -> []
      keeper -> [owner: keeper]
    end
  end

  @doc """
  An `Nx.BinaryBackend` tensor of `template`'s type, shape and names holding `data`, the
  tensor's data as the node sends it: a bitstring for 2- and 4-bit types (`Nx.from_binary/3`
  takes whole bytes only).
  """
  def host_tensor(%Nx.Tensor{type: type, shape: shape, names: names}, data)
      when is_bitstring(data),
      do:
        Nx.BinaryBackend.from_binary(%Nx.Tensor{type: type, shape: shape, names: names}, data, [])

  # The largest result a run returns in its reply rather than keeping on the node, when its
  # tensors are to be XlaNode.Backend's: scalars and a few numbers (a loss, an accuracy, a
  # step count), which callers read, cost no request to read, and nothing to free.
  # docs/performance.md gives the measurement behind the bound.
  @inline_bytes 64

  @doc """
  Whether a result of `template`'s type and shape comes back inline in a run's reply (at most
  #{@inline_bytes} bytes, of a type of whole bytes) rather than staying on the node.
  """
  def inline?(%Nx.Tensor{type: {_, bits}} = template),
    do: rem(bits, 8) == 0 and Nx.size(template) * div(bits, 8) <= @inline_bytes

  @doc "`template` holding `data` here, inline, as an `XlaNode.Backend` tensor of `node`."
  def inline(template, node, data) when is_binary(data),
    do: %{template | data: %Backend{node: node, buffer: {:inline, data}}}

  @doc """
  `template` (a tensor or its template) holding `buffer` on `node` (held by `XlaNode.Keeper`);
  noted in the scope.
  """
  def wrap(template, node, buffer), do: %{template | data: hd(data(node, [buffer]))}

  @doc """
  The `XlaNode.Backend` data of buffers this process made on `node`, held by `XlaNode.Keeper`
  (one message to it for all): each with its token. Noted in the scope.
  """
  def data(_node, []), do: []

  def data(node, buffers) when is_list(buffers) do
    Enum.each(buffers, &Scope.made/1)
    tokens = XlaNode.Keeper.track(buffers) || Enum.map(buffers, fn _ -> nil end)

    Enum.zip_with(buffers, tokens, fn buffer, token ->
      %Backend{node: node, buffer: buffer, token: token}
    end)
  end

  @doc """
  Hands a tensor that lives on a node to `XlaNode.Keeper.hold/2` before it is used: a no-op
  for one this node's keeper holds already; one that came from another node is taken over.
  Returns the tensor.
  """
  def hold(%Nx.Tensor{data: %Backend{buffer: buffer, token: token}} = t)
      when is_reference(buffer) and is_binary(token) do
    XlaNode.Keeper.hold(token, buffer)
    t
  end

  def hold(t), do: t

  @doc "The whole data of an `XlaNode.Backend` tensor, read from its node."
  def read!(%Nx.Tensor{data: %Backend{buffer: {:inline, binary}}}), do: binary

  def read!(%Nx.Tensor{data: %Backend{node: node, buffer: buffer}} = t) do
    hold(t)

    case XlaNode.read(node, buffer) do
      {:ok, {binary, _}} -> binary
      {:error, error} -> raise gone(error, [buffer])
    end
  end

  @doc """
  Frees the tensor's buffer with this process's next request to a node (`XlaNode.free_later/1`:
  no message of its own, no answer to wait for): `:ok`, or `:already_deallocated` when it is
  to be freed already.
  """
  def free(%Nx.Tensor{data: %Backend{buffer: {:inline, _}}}), do: :ok

  def free(%Nx.Tensor{data: %Backend{buffer: buffer}}) do
    case XlaNode.free_later(buffer) do
      :ok -> :ok
      :already_noted -> :already_deallocated
    end
  end

  @doc """
  The run arguments for a program on `node` (a node or a pool): the buffers of the tensors that
  live where the first such tensor's buffer does, the data of any other (a tensor of another
  node is read from it through this node), so that the run goes to one node.
  """
  def args(tensors, node) do
    home =
      Enum.find_value(tensors, fn
        %Nx.Tensor{data: %Backend{node: ^node, buffer: b}} when is_reference(b) -> node(b)
        _ -> nil
      end)

    Enum.map(tensors, fn
      %Nx.Tensor{data: %Backend{node: ^node, buffer: b}} = t
      when is_reference(b) and node(b) == home ->
        hold(t)
        b

      t ->
        t = Nx.devectorize(t)
        {Nx.to_binary(t), {t.type, Tuple.to_list(t.shape)}}
    end)
  end

  @doc """
  Runs `exe` on `node` with `args` (from `arg/2`) and `opts` (`XlaNode.run/4`'s); returns the
  results or raises, naming the node and, for a buffer it no longer has, saying it is gone.
  """
  def run!(node, exe, args, opts) do
    case XlaNode.run(node, exe, args, opts) do
      {:ok, results} -> results
      {:error, error} -> raise gone(error, Enum.filter(args, &is_reference/1))
    end
  end

  # A reference the node does not know was freed, or is of an earlier run of the node; a node
  # that cannot be reached has dropped this node's buffers.
  defp gone(%XlaNode.Error{kind: :argument_error, message: message} = error, buffers) do
    if buffers != [] and message =~ ~r/^(argument \d+: )?unknown or freed reference/ do
      %XlaNode.Error{
        kind: :gone,
        message:
          "a tensor on #{inspect(node(hd(buffers)))} is gone: its buffer was freed " <>
            "(Nx.backend_deallocate/1, XlaNode.Backend.free_all/1, the end of an " <>
            "XlaNode.Backend.scope/1, or no process of any node held it any more) " <>
            "or the node restarted",
        reason: error.reason
      }
    else
      error
    end
  end

  defp gone(%XlaNode.Error{kind: kind} = error, [buffer | _])
       when kind in [:nodedown, :noproc] do
    %{error | message: error.message <> ": the tensors on #{inspect(node(buffer))} are gone"}
  end

  defp gone(error, _buffers), do: error
end
