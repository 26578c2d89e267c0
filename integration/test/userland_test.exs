defmodule XlaNode.UserlandTest do
  @moduledoc """
  `scripts/userland.sh`, which makes the Debian userlands whose BEAMs the suites also run from:
  a userland is used only when complete, and one half made (a run cut short) is removed and made
  again, never used.

  The script runs for real, on a fresh data directory (`XDG_DATA_HOME`) holding userlands in
  every state, without fetching anything: making one is tried with a stand-in `debootstrap`,
  first on PATH, that writes down how it was called and fails.
  """
  use ExUnit.Case, async: true

  @script Path.expand("../../scripts/userland.sh", __DIR__)

  setup do
    dir = Path.join(System.tmp_dir!(), "xn_userland_#{System.unique_integer([:positive])}")
    data = Path.join(dir, "data")
    bin = Path.join(dir, "bin")
    marks = Path.join(dir, "marks")
    File.mkdir_p!(Path.join(data, "xla_node/userlands"))
    File.mkdir_p!(bin)
    on_exit(fn -> File.rm_rf!(dir) end)

    debootstrap = Path.join(bin, "debootstrap")
    File.write!(debootstrap, "#!/bin/sh\necho \"debootstrap $*\" >>'#{marks}'\nexit 1\n")
    File.chmod!(debootstrap, 0o755)

    env = [{"XDG_DATA_HOME", data}, {"PATH", bin <> ":" <> System.get_env("PATH")}]
    %{env: env, root: Path.join(data, "xla_node/userlands/trixie"), marks: marks}
  end

  defp userland(args, ctx), do: System.cmd(@script, args, env: ctx.env, stderr_to_stdout: true)

  defp state(ctx) do
    {out, 0} = userland(["state", "trixie"], ctx)
    String.trim_trailing(out)
  end

  # A userland as a complete run leaves it: the stamp, the programs, dpkg's record of every
  # package installed.
  defp make_complete(ctx) do
    {recipe, 0} = userland(["recipe", "trixie"], ctx)
    ["packages " <> packages] = recipe |> String.split("\n", trim: true) |> Enum.take(-1)

    for program <- ~w(erl elixir mix epmd openssl) do
      path = Path.join(ctx.root, "usr/bin/#{program}")
      File.mkdir_p!(Path.dirname(path))
      File.write!(path, "#!/bin/sh\n")
      File.chmod!(path, 0o755)
    end

    status =
      for package <- String.split(packages) do
        "Package: #{package}\nStatus: install ok installed\nVersion: 1\n\n"
      end

    File.mkdir_p!(Path.join(ctx.root, "var/lib/dpkg"))
    File.write!(Path.join(ctx.root, "var/lib/dpkg/status"), status)
    File.write!(Path.join(ctx.root, "etc/xla_node-userland"), recipe)
  end

  test "state: missing, complete, and each way of being half made", ctx do
    assert state(ctx) == "missing"

    File.mkdir_p!(Path.join(ctx.root, "etc"))
    assert state(ctx) == "incomplete: no stamp (a run that made it was interrupted)"

    make_complete(ctx)
    assert state(ctx) == "complete"

    # Made by an older recipe (another package list).
    stamp = Path.join(ctx.root, "etc/xla_node-userland")
    File.write!(stamp, File.read!(stamp) |> String.replace("procps", "procps extra"))
    assert state(ctx) == "incomplete: made by another recipe"

    make_complete(ctx)
    File.rm!(Path.join(ctx.root, "usr/bin/elixir"))
    assert state(ctx) == "incomplete: no /usr/bin/elixir"

    # apt-get cut short: a package unpacked, not configured.
    make_complete(ctx)
    status = Path.join(ctx.root, "var/lib/dpkg/status")

    File.write!(
      status,
      File.read!(status)
      |> String.replace(
        "Package: elixir\nStatus: install ok installed",
        "Package: elixir\nStatus: install ok half-configured"
      )
    )

    assert state(ctx) == "incomplete: not installed: elixir"
  end

  test "a half-made userland is removed and made again, not used", ctx do
    {why, available} = userland(["available"], ctx)

    if available != 0 do
      # Where userlands cannot be made at all: one line says why, and making one says so too.
      assert [_one_line] = String.split(why, "\n", trim: true)
      assert {out, 1} = userland(["make", "trixie"], ctx)
      assert out =~ "userland: cannot make the userlands here: "
    else
      File.mkdir_p!(Path.join(ctx.root, "usr/bin"))
      File.write!(Path.join(ctx.root, "usr/bin/left_over"), "")
      File.mkdir_p!(ctx.root <> ".partial")

      assert {out, 1} = userland(["run", "trixie", "true"], ctx)

      assert out =~
               "#{ctx.root} is incomplete: no stamp (a run that made it was interrupted): removing it"

      assert out =~ "userland: making the Debian 13 trixie userland"

      # Removed, and made again from scratch, into the partial directory.
      refute File.exists?(Path.join(ctx.root, "usr/bin/left_over"))

      assert ["debootstrap --variant=minbase trixie " <> rest] =
               File.read!(ctx.marks) |> String.split("\n", trim: true)

      assert [partial, mirror] = String.split(rest)
      assert partial == ctx.root <> ".partial"
      assert mirror =~ ~r{^https?://}
      assert state(ctx) == "missing"
    end
  end
end
