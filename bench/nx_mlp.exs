# The defn benchmark (bench/run.sh nx): an MLP's forward pass and its gradient jitted with
# XlaNode.Compiler on an xla_node, against JAX's jax.jit of the same model with the same values,
# JAX running on the node's own PJRT plugin where it loads it (bench/nx_mlp_jax.py says which).
# A JAX process serves one call per request, so that JAX's calls and the node's alternate one by
# one and machine noise hits both alike. It also times compiling: the Elixir lowering and the
# node's compile request against JAX's lower() and compile(), with fresh shapes each time (the
# node keeps compiled programs by their text, and XlaNode.Compiler by their argument shapes).
#
# Runs inside the elixir_nx Mix project, which needs Nx (NX_PATH) and Elixir >= 1.17:
#   cd elixir_nx && elixir --sname NAME --cookie COOKIE -S mix run ../bench/nx_mlp.exs XLA_NODE_SNAME
# with XLA_NODE_BENCH_JAX naming the folder that holds JAX (scripts/kernels.sh installs it).

[xla_name] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)

defmodule Bench.NxMLP do
  @moduledoc "The model, as bench/nx_mlp_jax.py has it: three dense layers, tanh, MSE loss."
  import Nx.Defn

  @batch 256
  @width 1024
  @param_names [:w1, :b1, :w2, :b2, :w3, :b3]

  def batch, do: @batch
  def width, do: @width
  def param_names, do: @param_names

  defn forward(params, x) do
    h1 = Nx.tanh(Nx.dot(x, params.w1) + params.b1)
    h2 = Nx.tanh(Nx.dot(h1, params.w2) + params.b2)
    Nx.dot(h2, params.w3) + params.b3
  end

  defn loss(params, x, y) do
    Nx.mean((forward(params, x) - y) ** 2)
  end

  defn loss_grad(params, x, y) do
    grad(params, &loss(&1, x, y))
  end

  @doc "One training step: the loss and its gradient, then SGD with rate 0.01, as JAX's."
  defn train_step(params, x, y) do
    {loss, grads} = value_and_grad(params, &loss(&1, x, y))
    {sgd(params, grads), loss}
  end

  deftransformp sgd(params, grads) do
    Map.new(params, fn {name, p} -> {name, Nx.subtract(p, Nx.multiply(0.01, grads[name]))} end)
  end

  @doc "The function of `kind` and argument templates for it with batch `n`."
  def function(:forward), do: &forward/2
  def function(:grad), do: &loss_grad/3

  def templates(kind, n) do
    params =
      Map.new(@param_names, fn name ->
        shape = if name in [:b1, :b2, :b3], do: {@width}, else: {@width, @width}
        {name, Nx.template(shape, :f32)}
      end)

    inputs = if kind == :forward, do: [:x], else: [:x, :y]
    [params | Enum.map(inputs, fn _ -> Nx.template({n, @width}, :f32) end)]
  end
end

defmodule Bench.NxMLP.LowerOnly do
  @moduledoc """
  An `Nx.Defn.Compiler` that only traces the function and lowers it with
  `XlaNode.Compiler.Lower.module`, as `XlaNode.Compiler` does before its compile request, and
  sends the caller `{:lowered, text, trace_us, lower_us}`; the compiled function cannot run.
  """
  @behaviour Nx.Defn.Compiler

  @impl true
  def __partitions_options__(opts), do: [opts]

  @impl true
  def __to_backend__(_opts), do: {Nx.BinaryBackend, []}

  @impl true
  def __jit__(key, vars, fun, args_list, opts),
    do: __compile__(key, vars, fun, opts).(args_list)

  @impl true
  def __compile__(_key, vars, fun, _opts) do
    t0 = System.monotonic_time(:microsecond)
    output = fun.(vars)
    t1 = System.monotonic_time(:microsecond)
    flat_vars = Nx.Defn.Composite.flatten_list(vars)

    %{text: text} =
      XlaNode.Compiler.Lower.module(flat_vars, Nx.Defn.Composite.flatten_list([output]))

    t2 = System.monotonic_time(:microsecond)
    send(self(), {:lowered, text, t1 - t0, t2 - t1})
    fn _ -> raise "Bench.NxMLP.LowerOnly only lowers" end
  end
end

defmodule Bench.NxMLP.Jax do
  @moduledoc "The bench/nx_mlp_jax.py process: one request, one answer line."

  def start(data_dir, plugin, batch, width) do
    port =
      Port.open({:spawn_executable, System.find_executable("python3")}, [
        :binary,
        :exit_status,
        {:line, 65_536},
        args:
          [Path.join(__DIR__, "nx_mlp_jax.py"), "--data-dir", data_dir] ++
            ["--batch", "#{batch}", "--width", "#{width}"] ++
            if(plugin, do: ["--plugin", plugin], else: []),
        env: [{~c"PYTHONPATH", String.to_charlist(System.fetch_env!("XLA_NODE_BENCH_JAX"))}]
      ])

    "ready " <> backend = line(port)
    {port, backend}
  end

  def request(port, command) do
    Port.command(port, command <> "\n")

    case line(port) do
      "error" <> _ = error -> raise "bench/nx_mlp_jax.py: #{error}"
      answer -> answer
    end
  end

  defp line(port) do
    receive do
      {^port, {:data, {:eol, line}}} -> line
      {^port, {:exit_status, status}} -> raise "bench/nx_mlp_jax.py exited with status #{status}"
    after
      300_000 -> raise "bench/nx_mlp_jax.py did not answer"
    end
  end
end

defmodule Bench.NxMLP.Stats do
  @moduledoc "Timing and medians."
  def median(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples), 2))

  def time_us(fun) do
    t0 = System.monotonic_time(:nanosecond)
    result = fun.()
    {(System.monotonic_time(:nanosecond) - t0) / 1000, result}
  end

  def ms(us), do: :erlang.float_to_binary(us / 1000, decimals: 2) <> " ms"
  def ratio(a, b), do: :erlang.float_to_binary(a / b, decimals: 3)
  def sci(x), do: :erlang.float_to_binary(x / 1, scientific: 2)
end

alias Bench.NxMLP
alias Bench.NxMLP.{Jax, Stats}

{:ok, info} = XlaNode.info(xla)
data_dir = Path.join(System.tmp_dir!(), "xla_node_bench_nx_#{System.os_time()}")
{batch, width} = {NxMLP.batch(), NxMLP.width()}
{jax, jax_backend} = Jax.start(data_dir, info.plugin, batch, width)

read_f32 = fn name, shape ->
  Path.join(data_dir, "#{name}.f32") |> File.read!() |> Nx.from_binary(:f32) |> Nx.reshape(shape)
end

params =
  Map.new(NxMLP.param_names(), fn name ->
    {name, read_f32.(name, if(name in [:b1, :b2, :b3], do: {width}, else: {width, width}))}
  end)

x = read_f32.(:x, {batch, width})
y = read_f32.(:y, {batch, width})
args = fn kind, params -> if kind == :forward, do: [params, x], else: [params, x, y] end

jit = fn kind, opts ->
  Nx.Defn.jit(NxMLP.function(kind), [compiler: XlaNode.Compiler, node: xla] ++ opts)
end

# The params put on the node once, as keep_on_device: true results, and fed back each call.
to_node =
  Nx.Defn.jit(&Function.identity/1, compiler: XlaNode.Compiler, node: xla, keep_on_device: true)

params_on_node = to_node.(params)

# Both sides computed the same thing: the node's results against JAX's, on the same values.
"ok" = Jax.request(jax, "check")

max_diff = fn ours, theirs ->
  Nx.subtract(ours, theirs) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
end

max_abs = fn t -> t |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number() end
forward_out = apply(jit.(:forward, []), args.(:forward, params))
grads = apply(jit.(:grad, []), args.(:grad, params))
forward_diff = max_diff.(forward_out, read_f32.(:forward, {batch, width}))

grad_diff =
  grads
  |> Enum.map(fn {name, g} -> max_diff.(g, read_f32.("grad_#{name}", g.shape)) end)
  |> Enum.max()

grad_max = grads |> Enum.map(fn {_, g} -> max_abs.(g) end) |> Enum.max()

check_rows = [
  "max |node - JAX|, forward output: #{Stats.sci(forward_diff)} (max |output| #{Stats.sci(max_abs.(forward_out))})",
  "max |node - JAX|, gradient (all weights and biases): #{Stats.sci(grad_diff)} (max |gradient| #{Stats.sci(grad_max)})"
]

# Per call: each style of call on the node against its JAX counterpart, alternating one by one
# (which side goes first alternates too).
styles = [
  tensors: {"host", "tensors passed each call", "numpy params and inputs, numpy results"},
  kept:
    {"device", "params kept on the node (keep_on_device)",
     "params as jax.Array, results left on the device"}
]

node_call = fn kind, style ->
  {fun, call_params} =
    case style do
      :tensors -> {jit.(kind, []), params}
      # wait: true: timed until the results are computed, as JAX's block_until_ready.
      :kept -> {jit.(kind, keep_on_device: true, wait: true), params_on_node}
    end

  fn ->
    {us, result} = Stats.time_us(fn -> apply(fun, args.(kind, call_params)) end)
    # Results kept on the node are freed, outside the timing, so that they do not pile up there.
    if style == :kept,
      do: Enum.each(Nx.Defn.Composite.flatten_list([result]), &Nx.backend_deallocate/1)

    us
  end
end

pairs = %{forward: 100, grad: 60}
warmup = 3

per_call_rows =
  for kind <- [:forward, :grad], {style, {jax_style, label, jax_label}} <- styles do
    node_run = node_call.(kind, style)
    jax_run = fn -> String.to_float(Jax.request(jax, "run #{kind} #{jax_style}")) end
    for _ <- 1..warmup, do: {jax_run.(), node_run.()}

    samples =
      for i <- 1..pairs[kind] do
        if rem(i, 2) == 0 do
          {jax_run.(), node_run.()}
        else
          {node, jax} = {node_run.(), jax_run.()}
          {jax, node}
        end
      end

    {j, n} =
      {Stats.median(Enum.map(samples, &elem(&1, 0))),
       Stats.median(Enum.map(samples, &elem(&1, 1)))}

    pair_ratio = Stats.median(Enum.map(samples, fn {j, n} -> n / j end))
    name = if kind == :forward, do: "forward", else: "gradient"

    [
      "#{name}, #{label} (#{pairs[kind]} pairs):",
      "  XlaNode.Compiler: #{Stats.ms(n)}   JAX (#{jax_label}): #{Stats.ms(j)}   ratio #{Stats.ratio(n, j)} (median of pair ratios #{Stats.ratio(pair_ratio, 1)})  (target <= 1.1x)"
    ]
  end

# Training steps with the params on the node (XlaNode.Backend the default backend, as a user
# configures it): per step the batch goes and the loss comes back in the run's reply; the new
# params stay there and the old ones are freed with one cast (XlaNode.Backend.free_all/1). JAX's step keeps its params on the device the same way. Both
# sides take the same steps from the same params, so their losses agree step by step.
train_pairs = 60

dist_bytes = fn ->
  {_, port} = List.keyfind(:erlang.system_info(:dist_ctrl), xla, 0)
  {:ok, [send_oct: sent, recv_oct: received]} = :inet.getstat(port, [:send_oct, :recv_oct])
  {sent, received}
end

# Messages through the node's connections, by its own counters.
node_messages = fn ->
  {:ok, %{traffic: %{received_messages: received, sent_messages: sent}}} = XlaNode.info(xla)
  {received, sent}
end

train_rows =
  Nx.with_default_backend({XlaNode.Backend, node: xla}, fn ->
    step = Nx.Defn.jit(&NxMLP.train_step/3, compiler: XlaNode.Compiler, node: xla)

    node_step = fn params ->
      {us, {new_params, loss}} =
        Stats.time_us(fn ->
          result =
            XlaNode.Backend.scope(fn ->
              {new_params, loss} = step.(params, x, y)
              {new_params, Nx.to_number(loss)}
            end)

          XlaNode.Backend.free_all(params)
          result
        end)

      {us, loss, new_params}
    end

    jax_step = fn ->
      [us, loss] = Jax.request(jax, "train") |> String.split()
      {String.to_float(us), String.to_float(loss)}
    end

    params = Nx.backend_copy(params, {XlaNode.Backend, node: xla})

    params =
      Enum.reduce(1..warmup, params, fn _, params ->
        jax_step.()
        {_, _, params} = node_step.(params)
        params
      end)

    # What two :info calls in a row cost, taken off the count of the steps' messages.
    {in0, out0} = node_messages.()
    {in1, out1} = node_messages.()
    bytes_before = dist_bytes.()

    {samples, params} =
      Enum.map_reduce(1..train_pairs, params, fn i, params ->
        if rem(i, 2) == 0 do
          {jax_us, jax_loss} = jax_step.()
          {node_us, loss, params} = node_step.(params)
          {{jax_us, node_us, jax_loss, loss}, params}
        else
          {node_us, loss, params} = node_step.(params)
          {jax_us, jax_loss} = jax_step.()
          {{jax_us, node_us, jax_loss, loss}, params}
        end
      end)

    {sent, received} = dist_bytes.()
    {sent, received} = {sent - elem(bytes_before, 0), received - elem(bytes_before, 1)}
    {in2, out2} = node_messages.()
    {messages_in, messages_out} = {in2 - in1 - (in1 - in0), out2 - out1 - (out1 - out0)}
    XlaNode.Backend.free_all(params)

    {j, n} = {Stats.median(Enum.map(samples, &elem(&1, 0))), Stats.median(Enum.map(samples, &elem(&1, 1)))}
    pair_ratio = Stats.median(Enum.map(samples, fn {j, n, _, _} -> n / j end))
    loss_diff = samples |> Enum.map(fn {_, _, jl, l} -> abs(l - jl) / abs(jl) end) |> Enum.max()
    {_, _, _, first_loss} = hd(samples)
    {_, _, _, last_loss} = List.last(samples)
    params_bytes = 4 * (3 * width * width + 3 * width)
    batch_bytes = 4 * 2 * batch * width
    kib = fn b -> :erlang.float_to_binary(b / 1024, decimals: 1) <> " KiB" end

    [
      "training step (value_and_grad of the loss, SGD), params on the node (XlaNode.Backend) against params on JAX's device, #{train_pairs} pairs alternating; medians:",
      "  XlaNode.Compiler: #{Stats.ms(n)}   JAX: #{Stats.ms(j)}   ratio #{Stats.ratio(n, j)} (median of pair ratios #{Stats.ratio(pair_ratio, 1)})  (target <= 1.1x)",
      "  loss #{Stats.sci(first_loss)} -> #{Stats.sci(last_loss)} over the pairs; largest relative difference from JAX's loss at the same step: #{Stats.sci(loss_diff)}",
      "  on the connection per step: #{kib.(sent / train_pairs)} sent, #{kib.(received / train_pairs)} received (the batch x, y is #{kib.(batch_bytes)}; the params #{kib.(params_bytes)})",
      "  messages per step, by the node's counters: #{messages_in / train_pairs} in, #{messages_out / train_pairs} out (a call is 3 in and 1 out, a cast 1 in)"
    ]
  end)

# Compiling: fresh shapes each time (batch 256 + k). The split (Elixir lowering, then the node's
# compile request for that text) and JAX get one batch, the whole of Nx.Defn.compile/3 another.
compile_reps = 9
{:ok, %{cache_hits: hits_before}} = XlaNode.info(xla)

compile_rows =
  for kind <- [:forward, :grad] do
    samples =
      for i <- 1..compile_reps do
        {split_batch, whole_batch} = {batch + 2 * i - 1, batch + 2 * i}

        [jax_lower, jax_compile] =
          Jax.request(jax, "compile #{kind} #{split_batch}")
          |> String.split()
          |> Enum.map(&String.to_float/1)

        Nx.Defn.compile(NxMLP.function(kind), NxMLP.templates(kind, split_batch),
          compiler: NxMLP.LowerOnly
        )

        {text, trace, lower} =
          receive(do: ({:lowered, text, trace, lower} -> {text, trace, lower}))

        {node_compile, {:ok, exe}} = Stats.time_us(fn -> XlaNode.compile(xla, text) end)
        :ok = XlaNode.free(xla, exe)

        {whole, _} =
          Stats.time_us(fn ->
            Nx.Defn.compile(NxMLP.function(kind), NxMLP.templates(kind, whole_batch),
              compiler: XlaNode.Compiler,
              node: xla
            )
          end)

        %{
          jax_lower: jax_lower,
          jax_compile: jax_compile,
          jax: jax_lower + jax_compile,
          trace: trace,
          lower: lower,
          node_compile: node_compile,
          whole: whole
        }
      end

    m = fn key -> Stats.median(Enum.map(samples, & &1[key])) end
    name = if kind == :forward, do: "forward", else: "gradient"

    [
      "#{name} (#{compile_reps} each):",
      "  Nx.Defn.compile/3 with XlaNode.Compiler, whole: #{Stats.ms(m.(:whole))}; in parts: trace the defn #{Stats.ms(m.(:trace))} + Lower.module #{Stats.ms(m.(:lower))} + the node's compile request #{Stats.ms(m.(:node_compile))}",
      "  JAX: jax.jit(f).lower() #{Stats.ms(m.(:jax_lower))} + .compile() #{Stats.ms(m.(:jax_compile))} = #{Stats.ms(m.(:jax))}",
      "  ratio whole/JAX: #{Stats.ratio(m.(:whole), m.(:jax))}; Elixir trace + lowering / JAX lower(): #{Stats.ratio(m.(:trace) + m.(:lower), m.(:jax_lower))}; node compile / JAX compile(): #{Stats.ratio(m.(:node_compile), m.(:jax_compile))}"
    ]
  end

{:ok, %{cache_hits: hits_after}} = XlaNode.info(xla)

cache_note =
  if hits_after == hits_before,
    do: [],
    else: ["  (warning: #{hits_after - hits_before} compile requests hit the node's cache)"]

Port.close(jax)
File.rm_rf!(data_dir)

IO.puts(
  "\n## defn: MLP forward and gradient (batch #{batch}, 3 dense layers of #{width}, f32, tanh; gradient of an MSE loss w.r.t. all weights and biases)\n" <>
    Enum.map_join(
      ["JAX 0.8.1 ran on: #{jax_backend}", "node: #{info.plugin} (#{info.platform})"] ++
        check_rows ++
        [
          "per call, from this BEAM node through Nx.Defn.jit(..., compiler: XlaNode.Compiler) against jax.jit, alternating one by one; medians:"
        ] ++
        Enum.map(List.flatten(per_call_rows), &("  " <> &1)) ++
        train_rows ++
        ["compile, fresh shapes each time; medians:"] ++
        Enum.map(List.flatten(compile_rows), &("  " <> &1)) ++ cache_note,
      "\n",
      &("  " <> &1)
    )
)
