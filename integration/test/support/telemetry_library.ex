defmodule XlaNode.TelemetryLibrary do
  @moduledoc """
  The real `:telemetry` library for the tests of the client's telemetry events, built from a
  checkout of its source: the integration project has no dependencies (Hex is not reachable),
  and the client emits events only when `:telemetry` is there.

  `TELEMETRY_PATH` names the checkout (beam-telemetry/telemetry, as elixir_nx's tests use it).
  `start/0` compiles its `src/*.erl` into a temporary directory, puts that on the code path and
  starts the application; `unavailable/0` says why the tests that need it are skipped.
  """

  @doc "Why the telemetry tests cannot run here, or `nil` when they can."
  def unavailable do
    case System.get_env("TELEMETRY_PATH") do
      nil ->
        "TELEMETRY_PATH is not set: point it at a checkout of the telemetry library " <>
          "(beam-telemetry/telemetry) to test the client's :telemetry events"

      path ->
        unless File.exists?(Path.join(path, "src/telemetry.erl")),
          do: "TELEMETRY_PATH=#{path} holds no src/telemetry.erl"
    end
  end

  @doc "Compiles (once per VM) and starts `:telemetry`."
  def start do
    unless Code.ensure_loaded?(:telemetry), do: build(System.fetch_env!("TELEMETRY_PATH"))
    {:ok, _} = Application.ensure_all_started(:telemetry)
    :ok
  end

  defp build(path) do
    src = Path.join(path, "src")
    out = Path.join(System.tmp_dir!(), "xla_node_telemetry_#{System.pid()}")
    File.mkdir_p!(out)

    modules =
      for file <- Path.wildcard(Path.join(src, "*.erl")) do
        opts = [:return_errors, :report_warnings, outdir: String.to_charlist(out), i: ~c"#{src}"]

        case :compile.file(String.to_charlist(file), opts) do
          {:ok, module} -> module
          {:ok, module, _warnings} -> module
          error -> raise "cannot compile #{file}: #{inspect(error)}"
        end
      end

    true = Code.prepend_path(out)
    {:ok, [{:application, :telemetry, spec}]} = :file.consult(Path.join(src, "telemetry.app.src"))
    :ok = :application.load({:application, :telemetry, Keyword.put(spec, :modules, modules)})
  end
end
