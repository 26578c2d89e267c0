defmodule XlaNode.Certs do
  @moduledoc """
  Certificates for TLS distribution tests, made with the `openssl` command: certificate
  authorities, node certificates they sign (subjectAltName: the host's name, which OTP's
  `inet_tls_dist` names as the server when it dials `name@host`), and OTP's
  `-ssl_dist_optfile` files that xla_node reads too.

      dir = Certs.tmp_dir("tls")
      ca = Certs.ca(dir, "ca")
      node = Certs.node_cert(dir, "node", ca, Harness.host())
      file = Certs.optfile(dir, "dist.conf", node, ca)
  """

  @doc "A fresh empty directory under the system's temporary directory."
  def tmp_dir(prefix) do
    dir =
      Path.join(
        System.tmp_dir!(),
        "#{prefix}_#{System.pid()}_#{System.unique_integer([:positive])}"
      )

    File.rm_rf!(dir)
    File.mkdir_p!(dir)
    dir
  end

  @doc "A self-signed CA (EC P-256). Returns `%{cert: path, key: path}`."
  def ca(dir, name) do
    cert = Path.join(dir, "#{name}.pem")
    key = Path.join(dir, "#{name}.key")

    openssl!(
      ["req", "-x509" | new_key(key)] ++
        [
          "-out",
          cert,
          "-days",
          "30",
          "-subj",
          "/CN=#{name}",
          "-addext",
          "basicConstraints=critical,CA:TRUE",
          "-addext",
          "keyUsage=critical,keyCertSign,cRLSign"
        ]
    )

    %{cert: cert, key: key}
  end

  @doc """
  A node certificate signed by `ca`, valid for `host` (DNS subjectAltName), for both the server
  and the client side of a connection. Returns `%{cert: path, key: path}`.
  """
  def node_cert(dir, name, ca, host) do
    cert = Path.join(dir, "#{name}.pem")
    key = Path.join(dir, "#{name}.key")
    csr = Path.join(dir, "#{name}.csr")
    ext = Path.join(dir, "#{name}.ext")

    openssl!(
      ["req" | new_key(key)] ++
        [
          "-out",
          csr,
          "-subj",
          "/CN=#{name}"
        ]
    )

    File.write!(ext, """
    subjectAltName = DNS:#{host}
    basicConstraints = CA:FALSE
    keyUsage = critical, digitalSignature
    extendedKeyUsage = serverAuth, clientAuth
    """)

    openssl!([
      "x509",
      "-req",
      "-in",
      csr,
      "-CA",
      ca.cert,
      "-CAkey",
      ca.key,
      "-CAcreateserial",
      "-out",
      cert,
      "-days",
      "30",
      "-extfile",
      ext
    ])

    %{cert: cert, key: key}
  end

  @doc """
  Writes an `-ssl_dist_optfile` in OTP's format: `identity`'s certificate and key on both sides,
  `trusted` as the CA, peers verified both ways (`verify_peer`, `fail_if_no_peer_cert`).
  Returns its path.
  """
  def optfile(dir, name, identity, trusted) do
    path = Path.join(dir, name)

    side = """
    [{certfile, #{inspect(identity.cert)}},
       {keyfile, #{inspect(identity.key)}},
       {cacertfile, #{inspect(trusted.cert)}},
       {verify, verify_peer}\
    """

    File.write!(path, """
    %% TLS distribution options: erl -proto_dist inet_tls -ssl_dist_optfile FILE, and xla_node.
    [{server, #{side},
       {fail_if_no_peer_cert, true}]},
     {client, #{side}]}].
    """)

    path
  end

  @doc "The `erl` arguments that make a BEAM node use TLS distribution with `optfile`."
  def erl_args(optfile), do: ["-proto_dist", "inet_tls", "-ssl_dist_optfile", optfile]

  @doc "The xla_node arguments for the same."
  def node_args(optfile), do: ["--proto-dist", "inet_tls", "--ssl-dist-optfile", optfile]

  # `openssl req` arguments for a new request with a new EC P-256 key written to `key`.
  defp new_key(key),
    do: ["-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-keyout", key]

  defp openssl!(args) do
    case System.cmd("openssl", args, stderr_to_stdout: true) do
      {_, 0} -> :ok
      {out, status} -> raise "openssl #{Enum.join(args, " ")} exited with #{status}:\n#{out}"
    end
  end
end
