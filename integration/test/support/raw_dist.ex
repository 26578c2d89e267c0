defmodule XlaNode.Harness.RawDist do
  @moduledoc """
  A minimal hand-written distribution client (handshake version 6, OTP 23+), for tests that must
  send what a real BEAM never would: garbage, truncated frames, hostile terms.

      {:ok, conn} = RawDist.connect(node)              # full handshake, pass-through frames
      {:ok, :pong} = RawDist.gen_call(conn, :xla, :ping)
      :ok = RawDist.send_raw(conn, <<0, 0, 0, 3, 1, 2, 3>>)
      :closed = RawDist.await_closed(conn)

  Handshake messages are `Length:16` framed; after the handshake every frame is `Length:32`.
  The client does not advertise DFLAG_FRAGMENTS, so the node talks to it in the pass-through
  format (`112`, control term, payload term), which is also what this client sends.

  Calls can carry what OTP 25 cannot make (an OTP 29 native record, `native_record/3`, or bytes
  no decoder knows) as encoded request bytes (`gen_call_encoded/4`), and can be made the way
  OTP 24+ makes them, with an `[:alias | ref]` tag (`alias: true`), to see how the reply comes
  back (`call/4`: the reply's control message too).
  """

  import Bitwise

  @extended_references 0x4
  @dist_monitor 0x8
  @fun_tags 0x10
  @dist_monitor_name 0x20
  @new_fun_tags 0x80
  @extended_pids_ports 0x100
  @export_ptr_tag 0x200
  @bit_binaries 0x400
  @new_floats 0x800
  @utf8_atoms 0x10000
  @map_tag 0x20000
  @big_creation 0x40000
  @handshake_23 0x1000000

  @doc "DFLAG_PUBLISHED: a node that sets it is visible; a hidden node does not."
  def published_flag, do: 0x1

  @doc "DFLAG_ALIAS (OTP 24+): the peer takes ALIAS_SEND."
  def alias_flag, do: 0x8 <<< 32

  @doc "DFLAG_ALTACT_SIG (OTP 28+): the peer takes ALTACT_SIG_SEND."
  def altact_sig_flag, do: 0x20 <<< 32

  @doc "DFLAG_NATIVE_RECORDS (OTP 29+): the peer takes native records."
  def native_records_flag, do: 0x40 <<< 32

  @doc "ALTACT_SIG_SEND flag bits: PRIO, TOKEN, ALIAS, NAME, EXIT."
  def altact(:prio), do: 1
  def altact(:token), do: 2
  def altact(:alias), do: 4
  def altact(:name), do: 8
  def altact(:exit), do: 16

  @doc "The OTP 25 mandatory flags plus monitors."
  def default_flags do
    @extended_references ||| @fun_tags ||| @new_fun_tags ||| @extended_pids_ports |||
      @export_ptr_tag ||| @bit_binaries ||| @new_floats ||| @utf8_atoms ||| @map_tag |||
      @big_creation ||| @handshake_23 ||| @dist_monitor ||| @dist_monitor_name
  end

  defstruct [:socket, :name, :creation, :peer_name, :peer_flags, :peer_creation]

  @doc "Opens a TCP connection to the node's distribution port (no handshake)."
  def open(%{dist_port: port}) do
    :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false, packet: :raw, nodelay: true])
  end

  @doc """
  Connects and completes the handshake. Options: `:cookie` (default: the node's), `:name`
  (default `rawN@host`), `:flags`, `:creation`. Returns `{:ok, conn}` or `{:error, reason}`.
  """
  def connect(node, opts \\ []) do
    cookie = to_string(Keyword.get(opts, :cookie, node.cookie || XlaNode.Harness.cookie()))
    name = Keyword.get(opts, :name, "#{XlaNode.Harness.unique_name("raw")}@#{XlaNode.Harness.host()}")
    flags = Keyword.get(opts, :flags, default_flags())
    creation = Keyword.get(opts, :creation, :rand.uniform(0xFFFF_FFF0) + 3)

    with {:ok, socket} <- open(node),
         :ok <- send_hs(socket, send_name(name, flags, creation)),
         {:ok, "sok"} <- recv_hs(socket),
         {:ok, <<?N, peer_flags::64, challenge::32, peer_creation::32, nlen::16, peer_name::binary-size(nlen)>>} <-
           recv_hs(socket),
         my_challenge = :rand.uniform(0xFFFF_FFFF),
         :ok <- send_hs(socket, <<?r, my_challenge::32, digest(cookie, challenge)::binary>>),
         {:ok, <<?a, ack::binary-16>>} <- recv_hs(socket) do
      if ack == digest(cookie, my_challenge) do
        {:ok,
         %__MODULE__{
           socket: socket,
           name: name,
           creation: creation,
           peer_name: peer_name,
           peer_flags: peer_flags,
           peer_creation: peer_creation
         }}
      else
        :gen_tcp.close(socket)
        {:error, :bad_ack_digest}
      end
    else
      {:ok, other} -> {:error, {:unexpected, other}}
      {:error, _} = e -> e
    end
  end

  @doc "The send_name message body: `N` Flags:64 Creation:32 NLen:16 Name."
  def send_name(name, flags \\ default_flags(), creation \\ 1) do
    <<?N, flags::64, creation::32, byte_size(name)::16, name::binary>>
  end

  @doc "md5(Cookie ++ integer_to_list(Challenge)), as dist_util computes it."
  def digest(cookie, challenge), do: :erlang.md5([cookie, Integer.to_string(challenge)])

  @doc "Sends one 2-byte-length framed handshake message on a raw socket."
  def send_hs(socket, body), do: :gen_tcp.send(socket, <<byte_size(body)::16, body::binary>>)

  @doc "Receives one handshake message."
  def recv_hs(socket, timeout \\ 5_000) do
    with {:ok, <<len::16>>} <- :gen_tcp.recv(socket, 2, timeout) do
      if len == 0, do: {:ok, <<>>}, else: :gen_tcp.recv(socket, len, timeout)
    end
  end

  @doc "Sends bytes as they are."
  def send_raw(%__MODULE__{socket: s}, bytes), do: :gen_tcp.send(s, bytes)
  def send_raw(socket, bytes), do: :gen_tcp.send(socket, bytes)

  @doc "Sends one `Length:32` frame."
  def send_frame(conn, body), do: send_raw(conn, <<byte_size(body)::32, body::binary>>)

  @doc "A pid of this raw node (for `from` fields and replies)."
  def pid(%__MODULE__{name: name, creation: creation}, id \\ 1, serial \\ 0) do
    :erlang.binary_to_term(
      <<131, 88, 118, byte_size(name)::16, name::binary, id::32, serial::32, creation::32>>
    )
  end

  @doc "A reference made by this raw node (as an alias it hands out would be)."
  def make_ref(%__MODULE__{name: name, creation: creation}) do
    ids = for _ <- 1..3, into: <<>>, do: <<:rand.uniform(0xFFFF_FFFF)::32>>

    :erlang.binary_to_term(
      <<131, 90, 3::16, 118, byte_size(name)::16, name::binary, creation::32, ids::binary>>
    )
  end

  @doc "A pass-through frame body: 112, control, payload (an encoded binary or a term)."
  def pass_through(control, payload \\ nil) do
    payload =
      case payload do
        nil -> <<>>
        {:encoded, bin} -> bin
        term -> :erlang.term_to_binary(term)
      end

    <<112, :erlang.term_to_binary(control)::binary, payload::binary>>
  end

  @doc """
  The frame bodies of one message sent in fragments of `size` bytes, as a node with
  DFLAG_FRAGMENTS sends it: `131 'E' Seq:64 Id:64 0` then `131 'F' Seq:64 Id:64`, ids counting
  down to 1, carrying the control and payload terms without version bytes.
  """
  def fragments(control, payload, size, seq \\ 1) do
    <<131, control::binary>> = :erlang.term_to_binary(control)
    <<131, payload::binary>> = :erlang.term_to_binary(payload)
    chunks = chunk(control <> payload, size)
    count = length(chunks)

    chunks
    |> Enum.with_index()
    |> Enum.map(fn
      {data, 0} -> <<131, ?E, seq::64, count::64, 0, data::binary>>
      {data, i} -> <<131, ?F, seq::64, count - i::64, data::binary>>
    end)
  end

  defp chunk(bin, size) when byte_size(bin) <= size, do: [bin]

  defp chunk(bin, size) do
    {part, rest} = :erlang.split_binary(bin, size)
    [part | chunk(rest, size)]
  end

  @doc "REG_SEND `message` to the registered name `to` on the node."
  def reg_send(conn, to, message) do
    send_frame(conn, pass_through({6, pid(conn), :"", to}, message))
  end

  @doc """
  A `gen_server` call to a registered name over the raw connection; returns `{:ok, reply}` or
  `{:error, reason}`.
  """
  def gen_call(conn, to, request, timeout \\ 5_000) do
    with {:ok, _control, reply} <- call(conn, to, request, timeout: timeout), do: {:ok, reply}
  end

  @doc """
  A call whose request is given as encoded bytes (external format without version byte), for
  terms this BEAM cannot make or that no decoder knows. Returns like `gen_call/4`.
  """
  def gen_call_encoded(conn, to, request_bytes, timeout \\ 5_000) do
    with {:ok, _control, reply} <- call(conn, to, {:encoded, request_bytes}, timeout: timeout),
         do: {:ok, reply}
  end

  @doc """
  A call to `to` (a registered name, or a pid of the node), sent as REG_SEND or SEND, or with
  `via: {:altact, flags}` as ALTACT_SIG_SEND with those flag bits (plus NAME for a name, and a
  token element when they hold TOKEN). `request` is a term or `{:encoded, bytes}`. Options:
  `alias: true` tags the call `[:alias | ref]` as OTP 24+ does; `timeout`. Returns
  `{:ok, reply_control, reply}`: the control message the reply came with, and the reply.
  """
  def call(conn, to, request, opts \\ []) do
    # An alias is made by the caller's node, which is where its replies go.
    ref = make_ref(conn)
    tag = if opts[:alias], do: [:alias | ref], else: ref

    request =
      case request do
        {:encoded, bytes} -> bytes
        term -> bare(term)
      end

    payload =
      <<131, 104, 3, bare(:"$gen_call")::binary, bare({pid(conn), tag})::binary, request::binary>>

    :ok = send_frame(conn, pass_through(control_to(conn, to, opts[:via]), {:encoded, payload}))

    await_reply(
      conn,
      tag,
      System.monotonic_time(:millisecond) + Keyword.get(opts, :timeout, 5_000)
    )
  end

  defp control_to(conn, to, nil) when is_atom(to), do: {6, pid(conn), :"", to}
  defp control_to(_conn, to, nil) when is_pid(to), do: {2, :"", to}

  defp control_to(conn, to, {:altact, flags}) do
    flags = if is_atom(to), do: flags ||| altact(:name), else: flags

    if (flags &&& altact(:token)) != 0,
      do: {37, flags, pid(conn), to, :a_trace_token},
      else: {37, flags, pid(conn), to}
  end

  defp await_reply(conn, tag, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    case recv_message(conn, left) do
      {:ok, control, {^tag, reply}} -> {:ok, control, reply}
      {:ok, _control, _other} -> await_reply(conn, tag, deadline)
      {:error, _} = e -> e
    end
  end

  @doc "A term in external format without its version byte."
  def bare(term) do
    <<131, rest::binary>> = :erlang.term_to_binary(term)
    rest
  end

  @doc """
  An OTP 29 native record as RECORD_EXT bytes (tag 67: field count, flags, module, name, field
  names, values), as an OTP 29 node encodes `#name{...}` of `module`: OTP 25 cannot make one.
  """
  def native_record(module, name, fields, exported \\ false) do
    names = for {k, _} <- fields, into: <<>>, do: bare(k)
    values = for {_, v} <- fields, into: <<>>, do: encode_value(v)

    <<67, length(fields)::32, if(exported, do: 1, else: 0), bare(module)::binary,
      bare(name)::binary, names::binary, values::binary>>
  end

  defp encode_value({:encoded, bytes}), do: bytes
  defp encode_value(term), do: bare(term)

  @doc "A tuple's bytes from encoded elements (`{:encoded, bytes}`) and terms."
  def tuple_bytes(elements) do
    body = for e <- elements, into: <<>>, do: encode_value(e)
    <<104, length(elements), body::binary>>
  end

  @doc "Receives the next non-tick frame, decoded as `{:ok, control, payload | nil}`."
  def recv_message(%__MODULE__{} = conn, timeout \\ 5_000) do
    recv_until(conn, System.monotonic_time(:millisecond) + timeout)
  end

  defp recv_until(%__MODULE__{socket: s} = conn, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    with {:ok, <<len::32>>} <- :gen_tcp.recv(s, 4, left) do
      if len == 0 do
        recv_until(conn, deadline)
      else
        with {:ok, body} <- :gen_tcp.recv(s, len, max(left, 1_000)), do: decode(body)
      end
    end
  end

  defp decode(<<112, rest::binary>>) do
    {control, used} = :erlang.binary_to_term(rest, [:used])
    payload = binary_part(rest, used, byte_size(rest) - used)
    {:ok, control, if(payload == <<>>, do: nil, else: :erlang.binary_to_term(payload))}
  end

  defp decode(other), do: {:error, {:unexpected_frame, other}}

  @doc """
  Waits until the node closes the connection (reading and dropping whatever it still sends).
  Returns `:closed` or `:timeout`.
  """
  def await_closed(conn, timeout \\ 5_000) do
    s = socket(conn)
    deadline = System.monotonic_time(:millisecond) + timeout
    await_closed_loop(s, deadline)
  end

  defp await_closed_loop(s, deadline) do
    left = deadline - System.monotonic_time(:millisecond)

    if left <= 0 do
      :timeout
    else
      case :gen_tcp.recv(s, 0, left) do
        {:ok, _} -> await_closed_loop(s, deadline)
        {:error, :timeout} -> :timeout
        {:error, _} -> :closed
      end
    end
  end

  def close(conn), do: :gen_tcp.close(socket(conn))

  defp socket(%__MODULE__{socket: s}), do: s
  defp socket(s), do: s
end
