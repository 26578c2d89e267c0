defmodule XlaNode.Launcher.Flags do
  @moduledoc false
  # The node's command-line flags as options of `XlaNode.Local` and the launchers: each flag
  # `--some-flag` is the option `some_flag:`, in the flag's own unit (seconds where the flag
  # counts seconds), checked here so that a wrong one is an ArgumentError naming it before any
  # process starts. `args/1` writes them back as flags; `env/1` gives the environment the node
  # reads (`XLA_NODE_LOG`, `XLA_NODE_CALLBACK_TRACE`, and `env:`).
  #
  # Not here: the node's name and cookie (the launcher chooses them), the plugin (a path on the
  # host where the node runs: each launcher resolves `plugin:` itself).

  @byte_count {:check, "a positive integer (bytes) or a string such as \"512M\" or \"8G\"",
               &__MODULE__.byte_count?/1}

  @port {:check, "an integer in 0..65535", &__MODULE__.port?/1}

  # {option, kind, flag} for the options that are one flag with one value (or none).
  @valued [
    {:visible_devices,
     {:check, "a non-empty list of device ids (non-negative integers)",
      &__MODULE__.device_ids?/1}, "--visible-devices"},
    {:memory_fraction, {:check, "a number in (0, 1]", &__MODULE__.fraction?/1},
     "--memory-fraction"},
    {:preallocate, :boolean, "--preallocate"},
    {:max_device_bytes, @byte_count, "--max-device-bytes"},
    {:max_message_bytes, @byte_count, "--max-message-bytes"},
    {:max_executables, :pos_integer, "--max-executables"},
    {:callback_timeout, :non_neg_integer, "--callback-timeout"},
    {:queue_timeout, :non_neg_integer, "--queue-timeout"},
    {:callback_spin_us, :non_neg_integer, "--callback-spin-us"},
    {:busy_wait_us, :non_neg_integer, "--busy-wait-us"},
    {:metrics_addr, {:check, "a string \"HOST:PORT\"", &__MODULE__.host_port?/1},
     "--metrics-addr"},
    {:net_ticktime, :pos_integer, "--net-ticktime"},
    {:inet_dist_listen_min, @port, "--inet-dist-listen-min"},
    {:inet_dist_listen_max, @port, "--inet-dist-listen-max"},
    {:inet_dist_use_interface,
     {:check, "an IP address, as a string (\"10.0.0.5\") or a tuple", &__MODULE__.address?/1},
     "--inet-dist-use-interface"},
    {:proto_dist, {:in, [:inet_tcp, :inet_tls]}, "--proto-dist"},
    {:ssl_dist_optfile, :string, "--ssl-dist-optfile"}
  ]

  @repeated [
    pjrt_options:
      {:check,
       "a keyword list or map of plugin options (booleans, integers, floats, lists of integers, strings)",
       &__MODULE__.pjrt_options?/1},
    kernels:
      {:check, "a list of {target, path, symbol} or \"TARGET=PATH:SYMBOL\" strings",
       &__MODULE__.kernels?/1},
    kernel_dirs: {:check, "a list of directories (strings)", &__MODULE__.strings?/1},
    kernel_version_shim:
      {:check, "true, or a list of kernel targets (strings)", &__MODULE__.shim?/1}
  ]

  @environment [
    log: :string,
    callback_trace: :boolean,
    env:
      {:check, "a keyword list or map of variable names to strings (or false: unset)",
       &__MODULE__.env?/1},
    args: {:check, "a list of strings (more flags for the node)", &__MODULE__.strings?/1}
  ]

  @doc "The option spec of the node's flags, for `XlaNode.Options.validate!/4`."
  def spec,
    do: Enum.map(@valued, fn {key, kind, _flag} -> {key, kind} end) ++ @repeated ++ @environment

  @doc "The options of `spec/0` given in `opts`, as the node's flags, in a fixed order."
  def args(opts) do
    valued =
      for {key, _kind, flag} <- @valued, Keyword.has_key?(opts, key) do
        [flag, render(key, Keyword.fetch!(opts, key))]
      end

    repeated =
      for {key, _kind} <- @repeated, value = opts[key], value not in [nil, false] do
        repeated(key, value)
      end

    List.flatten(valued ++ repeated ++ Keyword.get(opts, :args, []))
  end

  @doc "The environment variables the node reads, `[{name, value | false}]` (false unsets)."
  def env(opts) do
    log = if log = opts[:log], do: [{"XLA_NODE_LOG", log}], else: []

    trace =
      case Keyword.fetch(opts, :callback_trace) do
        {:ok, true} -> [{"XLA_NODE_CALLBACK_TRACE", "1"}]
        {:ok, false} -> [{"XLA_NODE_CALLBACK_TRACE", false}]
        :error -> []
      end

    extra = for {name, value} <- Keyword.get(opts, :env, []), do: {to_string(name), value}
    log ++ trace ++ extra
  end

  defp render(:visible_devices, ids), do: Enum.join(ids, ",")

  defp render(:inet_dist_use_interface, address) when is_tuple(address),
    do: address |> :inet.ntoa() |> to_string()

  defp render(_key, value), do: to_string(value)

  defp repeated(:pjrt_options, options) do
    for {name, value} <- options, do: ["--pjrt-option", pjrt_option(name, value)]
  end

  defp repeated(:kernels, kernels) do
    for kernel <- kernels do
      case kernel do
        {target, path, symbol} -> ["--kernel", "#{target}=#{path}:#{symbol}"]
        text -> ["--kernel", text]
      end
    end
  end

  defp repeated(:kernel_dirs, dirs), do: Enum.map(dirs, &["--kernel-dir", &1])
  defp repeated(:kernel_version_shim, true), do: ["--kernel-version-shim"]

  defp repeated(:kernel_version_shim, targets),
    do: Enum.map(targets, &"--kernel-version-shim=#{&1}")

  # Typed where the value's form alone could be read otherwise by the node ("3" as a string, a
  # one-element list).
  defp pjrt_option(name, value) when is_boolean(value), do: "#{name}:bool=#{value}"
  defp pjrt_option(name, value) when is_integer(value), do: "#{name}:int=#{value}"
  defp pjrt_option(name, value) when is_float(value), do: "#{name}:float=#{value}"
  defp pjrt_option(name, value) when is_list(value), do: "#{name}:ints=#{Enum.join(value, ",")}"
  defp pjrt_option(name, value) when is_binary(value), do: "#{name}:string=#{value}"

  ## Kinds

  @doc false
  def port?(n), do: is_integer(n) and n in 0..65_535

  @doc false
  def fraction?(f), do: is_number(f) and f > 0 and f <= 1

  @doc false
  def shim?(value), do: is_boolean(value) or strings?(value)

  @doc false
  def byte_count?(n) when is_integer(n), do: n > 0
  def byte_count?(text) when is_binary(text), do: text =~ ~r/\A[1-9][0-9]*[KMGkmg]?\z/
  def byte_count?(_), do: false

  @doc false
  def device_ids?(ids),
    do: is_list(ids) and ids != [] and Enum.all?(ids, &(is_integer(&1) and &1 >= 0))

  @doc false
  def host_port?(text), do: is_binary(text) and text =~ ~r/\A.+:[0-9]{1,5}\z/

  @doc false
  def address?(text) when is_binary(text),
    do: match?({:ok, _}, :inet.parse_address(String.to_charlist(text)))

  def address?(tuple) when is_tuple(tuple), do: :inet.ntoa(tuple) != {:error, :einval}
  def address?(_), do: false

  @doc false
  def strings?(list), do: is_list(list) and Enum.all?(list, &(is_binary(&1) and &1 != ""))

  @doc false
  def pjrt_options?(options) do
    (is_map(options) or Keyword.keyword?(options)) and
      Enum.all?(options, fn {name, value} ->
        (is_atom(name) or is_binary(name)) and pjrt_value?(value)
      end)
  end

  defp pjrt_value?(value) when is_boolean(value) or is_integer(value) or is_float(value),
    do: true

  defp pjrt_value?(value) when is_binary(value), do: true
  defp pjrt_value?(value) when is_list(value), do: value != [] and Enum.all?(value, &is_integer/1)
  defp pjrt_value?(_), do: false

  @doc false
  def kernels?(kernels) do
    is_list(kernels) and
      Enum.all?(kernels, fn
        {target, path, symbol} ->
          Enum.all?([target, path, symbol], &(is_binary(&1) or is_atom(&1)))

        text when is_binary(text) ->
          text =~ ~r/\A[^=]+=.+:[^:]+\z/

        _ ->
          false
      end)
  end

  @doc false
  def env?(env) do
    (is_map(env) or is_list(env)) and
      Enum.all?(env, fn
        {name, value} ->
          (is_atom(name) or is_binary(name)) and (is_binary(value) or value == false)

        _ ->
          false
      end)
  end
end
