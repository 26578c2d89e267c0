defmodule XlaNode.GpuSetupTest do
  @moduledoc """
  `scripts/setup.sh --gpu`, `scripts/start.sh --gpu` and `scripts/gpu_check.sh` on a machine
  without an NVIDIA driver: one clear message, a non-zero exit, and nothing downloaded,
  installed, built or started.

  The scripts run for real, with a fresh data directory (`XDG_DATA_HOME`) and, first on PATH,
  stand-ins for every program setup would otherwise use to fetch or build something (python3,
  pip, apt-get, sudo, cargo), each of which leaves a mark if it is run. On a machine with the
  driver these tests are skipped: there `--gpu` goes on to install several GB.
  """
  use ExUnit.Case, async: true

  @root Path.expand("../..", __DIR__)

  driver_present =
    File.exists?("/proc/driver/nvidia/version") or
      case System.cmd("sh", ["-c", "ldconfig -p || /sbin/ldconfig -p"], stderr_to_stdout: true) do
        {cache, _} -> cache =~ "libcuda.so.1 "
      end

  if driver_present do
    @moduletag skip: "this machine has an NVIDIA driver: --gpu would install the CUDA libraries"
  end

  @message "setup: no NVIDIA driver found (no libcuda.so.1 in the dynamic linker's cache, no " <>
             "/proc/driver/nvidia/version): --gpu needs an NVIDIA GPU with its driver installed " <>
             "(CUDA 13: driver 580 or newer); nothing was installed\n"

  @stand_ins ~w(python3 pip pip3 apt-get sudo cargo)

  setup do
    dir = Path.join(System.tmp_dir!(), "xn_gpu_setup_#{System.unique_integer([:positive])}")
    bin = Path.join(dir, "bin")
    data = Path.join(dir, "data")
    marks = Path.join(dir, "marks")
    File.mkdir_p!(bin)
    File.mkdir_p!(data)
    on_exit(fn -> File.rm_rf!(dir) end)

    for name <- @stand_ins do
      path = Path.join(bin, name)
      File.write!(path, "#!/bin/sh\necho \"#{name} $*\" >>'#{marks}'\nexit 1\n")
      File.chmod!(path, 0o755)
    end

    env = [
      {"PATH", bin <> ":" <> System.get_env("PATH")},
      {"XDG_DATA_HOME", data}
    ]

    %{env: env, data: data, marks: marks}
  end

  defp script(name, args, env),
    do: System.cmd(Path.join(@root, "scripts/#{name}"), args, env: env, stderr_to_stdout: true)

  # What the stand-ins recorded: nothing, or the command lines that ran.
  defp nothing_run(ctx), do: File.read(ctx.marks) == {:error, :enoent}

  test "setup.sh --gpu stops with one message and installs nothing", ctx do
    assert {@message, 1} = script("setup.sh", ["--gpu"], ctx.env)
    assert nothing_run(ctx)
    assert File.ls!(ctx.data) == []
  end

  test "start.sh --gpu stops the same way, before anything is set up or started", ctx do
    sname = XlaNode.Harness.unique_name("xla_gpu_start")
    assert {@message, 1} = script("start.sh", ["--gpu", "--sname", sname], ctx.env)
    assert nothing_run(ctx)
    assert File.ls!(ctx.data) == []
    refute XlaNode.Harness.epmd_registered?(sname)
  end

  test "gpu_check.sh stops the same way, and its summary line says it did not run", ctx do
    summary =
      "gpu_check: 0 passed, 1 failed, 0 skipped: not run: scripts/setup.sh --gpu failed (above)\n"

    assert {out, 1} = script("gpu_check.sh", [], ctx.env)
    assert out == @message <> summary
    assert nothing_run(ctx)
    assert File.ls!(ctx.data) == []
  end

  test "setup.sh refuses an argument it does not know, naming it", ctx do
    assert {out, 2} = script("setup.sh", ["--gpus"], ctx.env)
    assert out == "setup: unknown argument --gpus (usage: scripts/setup.sh [--gpu])\n"
    assert nothing_run(ctx)
  end
end
