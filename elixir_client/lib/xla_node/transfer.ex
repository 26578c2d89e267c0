defmodule XlaNode.Transfer do
  @moduledoc """
  Tensors of any size to and from a node, each message below the node's message limit.

  A node drops a connection whose peer sends one message over its `--max-message-bytes`, and
  with it every buffer the processes of that peer hold there. So `XlaNode.to_device/3` and
  `XlaNode.read/3` (and through them `XlaNode.Backend`) move a tensor larger than one chunk as
  a stream of chunks: `{:upload, {type, dims}}`, then one `GenServer.cast` of
  `{:upload, upload, chunk}` per chunk, then `{:upload_done, upload}` (a placed tensor begins
  with `{:upload, {type, dims}, [device: n]}`); a read asks for
  `{:read, buffer, chunk_bytes: n}` and receives the chunks as messages. A chunk is 32 MiB, or
  less where the node's limit (`:info`'s `max_message_bytes`, asked once per node and kept in
  `:persistent_term`) is lower.

  Requests other than `{:to_device, tensor}` and `{:read, buffer}` go through unchanged.
  """

  @chunk_bytes 32 * 1024 * 1024
  # What a chunk's message holds besides its bytes (the tuple, the reference, the atoms).
  @envelope_bytes 64 * 1024

  @doc """
  `GenServer.call(target, request, timeout)`, with a `:to_device` or `:read` larger than a chunk
  moved in chunks. Returns what the node replies, as one call would.
  """
  def call(target, {:to_device, {data, {type, dims}}} = request, timeout)
      when is_bitstring(data) do
    case chunk_bytes(target, timeout) do
      chunk when is_integer(chunk) and bit_size(data) > 8 * chunk ->
        upload(target, data, {:upload, {type, dims}}, chunk, timeout)

      _ ->
        GenServer.call(target, request, timeout)
    end
  end

  # With placement options (`device: n`), which the upload takes too.
  def call(target, {:to_device, {data, {type, dims}}, opts} = request, timeout)
      when is_bitstring(data) do
    case chunk_bytes(target, timeout) do
      chunk when is_integer(chunk) and bit_size(data) > 8 * chunk ->
        upload(target, data, {:upload, {type, dims}, opts}, chunk, timeout)

      _ ->
        GenServer.call(target, request, timeout)
    end
  end

  def call(target, {:read, buffer} = request, timeout) do
    case chunk_bytes(target, timeout) do
      nil ->
        GenServer.call(target, request, timeout)

      chunk ->
        case GenServer.call(target, {:read, buffer, [chunk_bytes: chunk]}, timeout) do
          {:ok, {:chunks, shape, count, stream}} -> receive_chunks(stream, shape, count, timeout)
          other -> other
        end
    end
  end

  def call(target, request, timeout), do: GenServer.call(target, request, timeout)

  @doc """
  The largest chunk sent to or read from `target`: 32 MiB, or the node's message limit less
  room for the message around it; `nil` for a node that does not say its limit (one without
  chunked transfers), to which tensors go whole.
  """
  def chunk_bytes(target, timeout) do
    case max_message_bytes(target, timeout) do
      nil -> nil
      limit -> max(min(@chunk_bytes, limit - @envelope_bytes), 1024)
    end
  end

  defp max_message_bytes(target, timeout) do
    node = XlaNode.Telemetry.node_of(target)
    key = {__MODULE__, :max_message_bytes, node}

    case :persistent_term.get(key, :unknown) do
      :unknown ->
        case GenServer.call(target, :info, timeout) do
          {:ok, %{max_message_bytes: limit}} when is_integer(limit) ->
            :persistent_term.put(key, limit)
            limit

          # A node of an older version: it has no chunked transfers either.
          _ ->
            nil
        end

      limit ->
        limit
    end
  end

  defp upload(target, data, begin, chunk, timeout) do
    case GenServer.call(target, begin, timeout) do
      {:ok, upload} ->
        data |> whole_bytes() |> send_chunks(target, upload, chunk)
        GenServer.call(target, {:upload_done, upload}, timeout)

      error ->
        error
    end
  end

  # A 2- or 4-bit tensor's data whose bits are not whole bytes goes with its last byte's
  # unused bits zero, as the node reads a bitstring.
  defp whole_bytes(data) when is_binary(data), do: data

  defp whole_bytes(data) do
    pad = 8 - rem(bit_size(data), 8)
    <<data::bitstring, 0::size(pad)>>
  end

  defp send_chunks(<<>>, _target, _upload, _chunk), do: :ok

  defp send_chunks(data, target, upload, chunk) when byte_size(data) <= chunk,
    do: GenServer.cast(target, {:upload, upload, data})

  defp send_chunks(data, target, upload, chunk) do
    <<head::binary-size(chunk), rest::binary>> = data
    GenServer.cast(target, {:upload, upload, head})
    send_chunks(rest, target, upload, chunk)
  end

  defp receive_chunks(stream, shape, count, timeout) do
    chunks =
      for index <- 0..(count - 1) do
        receive do
          {:xla_chunk, ^stream, ^index, data} -> data
        after
          timeout -> exit({:timeout, {__MODULE__, :read, [stream, index]}})
        end
      end

    {:ok, {concat(chunks), shape}}
  end

  # The last chunk of a 2- or 4-bit tensor may be a bitstring.
  defp concat(chunks), do: for(chunk <- chunks, into: <<>>, do: chunk)
end
