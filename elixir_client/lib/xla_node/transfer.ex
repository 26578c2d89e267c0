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

  A run (`{:run, exe, args}`, `{:run, exe, args, opts}`) whose tensors among `args` take more
  than a chunk in all places its largest ones on the node first, as above, until what is left
  fits in a chunk; the run takes those buffers in their place, and they are freed once it is
  answered. Each goes to the device the run will run on: the run's `device:`, else the device
  of its first buffer argument (`{:describe, buffer}`), else device 0; for a program compiled
  over several devices, each device's arguments to that device (`{:describe, exe}`).

  Other requests go through unchanged.

      # 64 MiB of f32: to the node in two chunks, and back in two.
      n = 16 * 1024 * 1024
      tensor = {:binary.copy(<<1.5::float-32-little>>, n), {{:f, 32}, [n]}}
      {:ok, buf} = XlaNode.to_device(:"xla@host", tensor)
      {:ok, ^tensor} = XlaNode.read(:"xla@host", buf)
  """

  @chunk_bytes 32 * 1024 * 1024
  # What a chunk's message holds besides its bytes (the tuple, the reference, the atoms).
  @envelope_bytes 64 * 1024

  @doc """
  `GenServer.call(target, request, timeout)`, with a `:to_device` or `:read` larger than a chunk
  moved in chunks. Returns what the node replies, as one call would.

      n = 16 * 1024 * 1024
      tensor = {:binary.copy(<<7>>, n), {{:u, 8}, [n]}}
      {:ok, buf} = XlaNode.Transfer.call({:xla, :"xla@host"}, {:to_device, tensor}, 60_000)
      {:ok, ^tensor} = XlaNode.Transfer.call({:xla, :"xla@host"}, {:read, buf}, 60_000)
      :pong = XlaNode.Transfer.call({:xla, :"xla@host"}, :ping, 5_000)
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

  def call(target, {:run, exe, args} = request, timeout) when is_list(args),
    do: run(target, request, exe, args, [], timeout)

  def call(target, {:run, exe, args, opts} = request, timeout)
      when is_list(args) and is_list(opts),
      do: run(target, request, exe, args, opts, timeout)

  def call(target, request, timeout), do: GenServer.call(target, request, timeout)

  # The run as it is when its tensors fit in a chunk; otherwise with its largest ones placed
  # first (see the moduledoc).
  defp run(target, request, exe, args, opts, timeout) do
    per_device? = args != [] and Enum.all?(args, &is_list/1)
    lists = if per_device?, do: args, else: [args]
    chunk = chunk_bytes(target, timeout)

    if is_integer(chunk) and tensor_bytes(lists) > chunk,
      do: run_placing(target, exe, lists, opts, per_device?, chunk, timeout),
      else: GenServer.call(target, request, timeout)
  end

  defp tensor_bytes(lists) do
    for list <- lists, {data, {_type, _dims}} when is_bitstring(data) <- list, reduce: 0 do
      bytes -> bytes + byte_size(data)
    end
  end

  defp run_placing(target, exe, lists, opts, per_device?, chunk, timeout) do
    placed = largest_beyond(lists, chunk)

    with {:ok, devices} <- run_devices(target, exe, lists, opts, per_device?, timeout),
         {:ok, buffers} <- place_each(target, placed, lists, devices, timeout) do
      lists =
        for {list, i} <- Enum.with_index(lists) do
          for {arg, j} <- Enum.with_index(list), do: Map.get(buffers, {i, j}, arg)
        end

      args = if per_device?, do: lists, else: hd(lists)
      request = if opts == [], do: {:run, exe, args}, else: {:run, exe, args, opts}

      try do
        GenServer.call(target, request, timeout)
      after
        GenServer.cast(target, {:free, Map.values(buffers)})
      end
    end
  end

  # The positions `{list, index}` of the largest tensors among the argument lists, taken until
  # the tensors left take a chunk at most.
  defp largest_beyond(lists, chunk) do
    sizes =
      for {list, i} <- Enum.with_index(lists),
          {{data, {_type, _dims}}, j} when is_bitstring(data) <- Enum.with_index(list),
          do: {{i, j}, byte_size(data)}

    total = sizes |> Enum.map(&elem(&1, 1)) |> Enum.sum()

    sizes
    |> Enum.sort_by(&elem(&1, 1), :desc)
    |> Enum.reduce_while({[], total}, fn
      _size, {placed, left} when left <= chunk -> {:halt, {placed, left}}
      {at, bytes}, {placed, left} -> {:cont, {[at | placed], left - bytes}}
    end)
    |> elem(0)
  end

  # The device each argument list runs on, as the node will choose it.
  defp run_devices(target, exe, _lists, _opts, true = _per_device?, timeout) do
    case GenServer.call(target, {:describe, exe}, timeout) do
      {:ok, %{devices: devices}} -> {:ok, devices}
      error -> error
    end
  end

  defp run_devices(target, _exe, [list], opts, false, timeout) do
    case Keyword.fetch(opts, :device) do
      {:ok, device} ->
        {:ok, [device]}

      :error ->
        case Enum.find(list, &is_reference/1) do
          nil ->
            {:ok, [0]}

          buffer ->
            case GenServer.call(target, {:describe, buffer}, timeout) do
              {:ok, %{device: device}} -> {:ok, [device]}
              error -> error
            end
        end
    end
  end

  # Places each tensor at `placed` on its list's device: `%{{list, index} => buffer}`. A failed
  # placement frees those made before it.
  defp place_each(target, placed, lists, devices, timeout) do
    Enum.reduce_while(placed, {:ok, %{}}, fn {i, j} = at, {:ok, buffers} ->
      tensor = lists |> Enum.at(i) |> Enum.at(j)

      case call(target, {:to_device, tensor, [device: Enum.at(devices, i)]}, timeout) do
        {:ok, buffer} ->
          {:cont, {:ok, Map.put(buffers, at, buffer)}}

        error ->
          GenServer.cast(target, {:free, Map.values(buffers)})
          {:halt, error}
      end
    end)
  end

  @doc """
  The largest chunk sent to or read from `target`: 32 MiB, or the node's message limit less
  room for the message around it; `nil` for a node that does not say its limit (one without
  chunked transfers), to which tensors go whole.

      XlaNode.Transfer.chunk_bytes({:xla, :"xla@host"}, 5_000)
      #=> 33_554_432
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
    # whole_bytes/1 made it a binary.
    {head, rest} = :erlang.split_binary(data, chunk)
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
