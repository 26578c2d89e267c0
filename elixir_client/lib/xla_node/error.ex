defmodule XlaNode.Error do
  @moduledoc """
  The error every `XlaNode` function returns as `{:error, %XlaNode.Error{}}` and every bang
  function raises.

  Fields:

    * `:kind` - an atom that says what went wrong:
      * errors the node reports: `:argument_error`, `:compile_error`, `:runtime_error`,
        `:timeout` (a run that waited longer than its `:queue_timeout` for a place),
        `:resource_exhausted` (a transfer or run that would take the device past the node's
        `--max-device-bytes`; it succeeds once buffers are freed), `:quota` (the same past this
        BEAM node's own device memory quota on the compute node, `--tenant ...:max_device_bytes`;
        it succeeds once this node's buffers there are freed), `:overloaded` (a run refused at
        once because this BEAM node already has its `max_queued` runs waiting there: back off
        and retry), and any other kind a node may send, e.g. `:bad_request`;
      * errors of the call itself, when the node could not be asked or did not answer:
        `:noproc` (no `:xla` process there), `:nodedown` (no connection to the node),
        `:timeout` (no answer within the `:timeout` option), `:exit` (the call exited for
        another reason), `:bad_reply` (an answer this library does not understand),
        `:no_nodes` (an `XlaNode.Pool` without nodes), `:launch_error` (a node that
        `XlaNode.Local` or a pool's launcher could not start: the message says why).
    * `:message` - a human readable message (a binary).
    * `:reason` - the raw reason: the exit reason for call errors, the `{kind, message}` term the
      node sent otherwise.
    * `:node` - the compute node the error is about, where one is known: the node that went down
      (`:nodedown`), or the node of an `XlaNode.Pool` that answered with the error; else `nil`.

  `Exception.message/1` puts the kind in front of the message:

      iex> error = %XlaNode.Error{kind: :runtime_error, message: "out of memory"}
      iex> Exception.message(error)
      "runtime_error: out of memory"
  """

  @type kind ::
          :argument_error
          | :compile_error
          | :runtime_error
          | :resource_exhausted
          | :quota
          | :overloaded
          | :noproc
          | :nodedown
          | :timeout
          | :exit
          | :bad_reply
          | :no_nodes
          | :launch_error
          | atom()

  @type t :: %__MODULE__{kind: kind(), message: String.t(), reason: term(), node: node() | nil}

  defexception kind: :runtime_error, message: "", reason: nil, node: nil

  @impl true
  def message(%__MODULE__{kind: kind, message: message}), do: "#{kind}: #{message}"

  @doc """
  An `:argument_error`: a call this library refuses before (or instead of) asking a node.

      iex> XlaNode.Error.argument_error("bad handle")
      %XlaNode.Error{kind: :argument_error, message: "bad handle", reason: {:argument_error, "bad handle"}}
  """
  @spec argument_error(String.t()) :: t()
  def argument_error(message),
    do: %__MODULE__{kind: :argument_error, message: message, reason: {:argument_error, message}}

  @doc """
  A `:nodedown` error about `node`: it is down, or went down before the call ended.

      iex> XlaNode.Error.nodedown(:"xla@host", "xla@host is not up").reason
      :nodedown
  """
  @spec nodedown(node(), String.t()) :: t()
  def nodedown(node, message),
    do: %__MODULE__{kind: :nodedown, reason: :nodedown, node: node, message: message}

  @doc """
  A `:nodedown` error of an `XlaNode.Pool` none of whose `nodes` is up.

      iex> XlaNode.Error.nodes_down([:"a@h"], "no node is up").reason
      {:nodes_down, [:"a@h"]}
  """
  @spec nodes_down([node()], String.t()) :: t()
  def nodes_down(nodes, message),
    do: %__MODULE__{kind: :nodedown, reason: {:nodes_down, nodes}, message: message}

  @doc """
  A `:no_nodes` error: an `XlaNode.Pool` without nodes.

      iex> XlaNode.Error.no_nodes("the pool has no nodes") |> Exception.message()
      "no_nodes: the pool has no nodes"
  """
  @spec no_nodes(String.t()) :: t()
  def no_nodes(message), do: %__MODULE__{kind: :no_nodes, reason: :no_nodes, message: message}

  @doc """
  A `:noproc` error: no process to ask (an unknown or stopped `XlaNode.Pool`).

      iex> XlaNode.Error.noproc("no pool named MyPool").kind
      :noproc
  """
  @spec noproc(String.t()) :: t()
  def noproc(message), do: %__MODULE__{kind: :noproc, reason: :noproc, message: message}

  @doc """
  A `:timeout` error: no answer in time.

      iex> raise XlaNode.Error.timeout("no reply in 5000 ms")
      ** (XlaNode.Error) timeout: no reply in 5000 ms
  """
  @spec timeout(String.t()) :: t()
  def timeout(message), do: %__MODULE__{kind: :timeout, reason: :timeout, message: message}

  @doc """
  Builds an error from what the node sent after `:error` (`{kind, message}`). A message that is
  a charlist (an Erlang string) becomes its text; any other term is inspected.

      iex> XlaNode.Error.from_reason({:compile_error, "bad MLIR"})
      %XlaNode.Error{kind: :compile_error, message: "bad MLIR", reason: {:compile_error, "bad MLIR"}}

      iex> XlaNode.Error.from_reason({:argument_error, ~c"bad shape"}).message
      "bad shape"

      iex> XlaNode.Error.from_reason(:weird).kind
      :bad_reply
  """
  @spec from_reason(term()) :: t()
  def from_reason({kind, message} = reason) when is_atom(kind) and is_binary(message),
    do: %__MODULE__{kind: kind, message: message, reason: reason}

  def from_reason({kind, message} = reason) when is_atom(kind) do
    text =
      if is_list(message) and :io_lib.printable_unicode_list(message),
        do: List.to_string(message),
        else: inspect(message)

    %__MODULE__{kind: kind, message: text, reason: reason}
  end

  def from_reason(reason),
    do: %__MODULE__{
      kind: :bad_reply,
      message: "unexpected error #{inspect(reason)}",
      reason: reason
    }

  @doc """
  Builds an error from the reason a `GenServer.call/3` exited with.

      iex> XlaNode.Error.from_exit({:nodedown, :"xla@host"}, {:xla, :"xla@host"}).kind
      :nodedown

      iex> XlaNode.Error.from_exit(:timeout, {:xla, :"xla@host"}).message
      "no reply from {:xla, :xla@host} in time"
  """
  @spec from_exit(term(), GenServer.server()) :: t()
  def from_exit(reason, server) do
    case reason do
      {reason, {GenServer, :call, _}} ->
        from_exit(reason, server)

      :noproc ->
        %__MODULE__{kind: :noproc, message: "no process at #{inspect(server)}", reason: reason}

      {:nodedown, node} ->
        %__MODULE__{
          kind: :nodedown,
          message: "node #{inspect(node)} is down or unreachable",
          reason: reason,
          node: node
        }

      :nodedown ->
        %__MODULE__{
          kind: :nodedown,
          message: "node of #{inspect(server)} is down or unreachable",
          reason: reason
        }

      :noconnection ->
        %__MODULE__{
          kind: :nodedown,
          message: "lost the connection to #{inspect(server)}",
          reason: reason
        }

      :timeout ->
        %__MODULE__{
          kind: :timeout,
          message: "no reply from #{inspect(server)} in time",
          reason: reason
        }

      other ->
        %__MODULE__{
          kind: :exit,
          message: "call to #{inspect(server)} exited: #{inspect(other)}",
          reason: other
        }
    end
  end
end
