defmodule XlaNode.ResourceLimitsTest do
  @moduledoc """
  `--max-device-bytes` and `--max-executables`: a transfer or run that would take the device past
  its bound is refused with `:resource_exhausted` before anything is allocated, while another
  client's runs go on; the compile cache keeps at most its bound of programs nobody holds, so a
  node compiling a new program per request stops growing.
  """
  use ExUnit.Case, async: true

  alias XlaNode.{Harness, Load}

  @limit 1024 * 1024
  # 600 KiB of f32: one such buffer fits under the limit, two do not.
  @big_n div(600 * 1024, 4)
  # A run returning 512 KiB: it fits alone, not beside a 600 KiB buffer.
  @wide_n div(512 * 1024, 4)

  defp call(node, request, timeout \\ 30_000),
    do: GenServer.call({:xla, node.name}, request, timeout)

  defp info(node) do
    {:ok, info} = call(node, :info)
    info
  end


  # A program of its own for each `k`: its 256 KiB constant (distinct values, which XLA keeps in
  # the executable) differs from every other's, so the cache cannot share it, and each executable
  # kept alive is plainly visible in the node's RSS.
  @distinct_n 65_536
  defp distinct_program(k) do
    values = for i <- 0..(@distinct_n - 1), into: <<>>, do: <<k * 1.0e6 + i::float-32-little>>

    """
    func.func @main(%x: tensor<#{@distinct_n}xf32>) -> tensor<#{@distinct_n}xf32> {
      %c = stablehlo.constant dense<"0x#{Base.encode16(values)}"> : tensor<#{@distinct_n}xf32>
      %y = stablehlo.add %x, %c : tensor<#{@distinct_n}xf32>
      return %y : tensor<#{@distinct_n}xf32>
    }
    """
  end

  defp vm_rss_kib(os_pid) do
    [_, kib] = Regex.run(~r/VmRSS:\s+(\d+) kB/, File.read!("/proc/#{os_pid}/status"))
    String.to_integer(kib)
  end

  describe "--max-device-bytes" do
    setup do
      node = Harness.start_node(args: ["--max-device-bytes", "1M"])
      Harness.connect!(node)
      {:ok, exe} = call(node, {:compile, Load.plus_one_program()})
      %{node: node, exe: exe}
    end

    test "a to_device past the limit is refused, another client's runs go on, and it fits once freed",
         %{node: node, exe: exe} do
      runs = Load.start_runs(node, exe)
      assert %{max_device_bytes: @limit} = info(node)
      big = Load.f32(0, @big_n)
      assert {:ok, first} = call(node, {:to_device, big})

      assert {:error, {:resource_exhausted, message}} = call(node, {:to_device, big})
      assert message =~ "needs #{@big_n * 4} bytes"
      assert message =~ "limit is #{@limit}"
      assert message =~ "--max-device-bytes"
      # Nothing was allocated for the refused copy.
      assert %{buffers: 1, buffer_bytes: held} = info(node)
      assert held == @big_n * 4

      assert :ok = call(node, {:free, first})
      assert {:ok, second} = call(node, {:to_device, big})
      assert {:ok, {data, _}} = call(node, {:read, second})
      assert data == elem(big, 0)

      assert {ok, []} = Load.stop_runs(runs)
      assert ok > 0
      assert %{request_errors: %{resource_exhausted: 1}} = info(node)
    end

    test "a run whose results would not fit is refused before it executes", %{
      node: node,
      exe: exe
    } do
      {:ok, wide} = call(node, {:compile, Load.wide_program(@wide_n)})
      x = Load.f32(3, 4)
      # Alone it fits, whether its results come back or stay on the device.
      assert {:ok, [{data, {{:f, 32}, [@wide_n]}}]} = call(node, {:run, wide, [x]})
      assert byte_size(data) == @wide_n * 4
      assert {:ok, [kept]} = call(node, {:run, wide, [x], [keep_on_device: true]})
      assert :ok = call(node, {:free, kept})

      runs = Load.start_runs(node, exe)
      {:ok, held} = call(node, {:to_device, Load.f32(0, @big_n)})
      %{runs: before, run_errors: errors_before} = info(node)

      assert {:error, {:resource_exhausted, message}} = call(node, {:run, wide, [x]})
      assert message =~ "the run needs #{@wide_n * 4 + 16} bytes"
      assert message =~ "limit is #{@limit}"

      assert {:error, {:resource_exhausted, _}} =
               call(node, {:run, wide, [x], [keep_on_device: true]})

      # The small runs go on meanwhile; the refusals are counted as failed runs.
      assert {ok, []} = Load.stop_runs(runs)
      assert ok > 0
      assert %{runs: runs_after, run_errors: errors_after, buffers: 1} = info(node)
      assert runs_after - before >= 2
      assert errors_after - errors_before == 2

      assert :ok = call(node, {:free, held})
      assert {:ok, [{^data, _}]} = call(node, {:run, wide, [x]})
    end
  end

  describe "--max-executables" do
    @tag timeout: 600_000
    test "programs freed beyond the bound are evicted and destroyed; held ones stay valid" do
      node = Harness.start_node(args: ["--max-executables", "50"])
      Harness.connect!(node)
      x = {:binary.copy(<<0.0::float-32-little>>, @distinct_n), {{:f, 32}, [@distinct_n]}}

      # Held throughout: never evicted, however many programs come after it.
      {:ok, kept} = call(node, {:compile, Load.plus_one_program()})

      compile_and_free = fn range ->
        for k <- range do
          {:ok, exe} = call(node, {:compile, distinct_program(k)})
          {:ok, [_]} = call(node, {:run, exe, [x]})
          :ok = call(node, {:free, exe})
        end
      end

      compile_and_free.(1..100)
      rss_100 = vm_rss_kib(node.os_pid)
      compile_and_free.(101..300)
      rss_300 = vm_rss_kib(node.os_pid)

      info = info(node)
      assert info.compiles == 301
      assert info.cache_hits == 0
      assert info.executables == 1
      # 51 at most: the 50 most recently used freed ones, and the held one among them or beside.
      assert info.cached_executables <= 51
      assert info.cache_evictions >= 250

      # An early program was evicted: compiling it again is a compile, not a cache hit.
      {:ok, again} = call(node, {:compile, distinct_program(1)})
      assert %{compiles: 302, cache_hits: 0} = info(node)
      assert {:ok, [_]} = call(node, {:run, again, [x]})
      # A recent one is still cached.
      {:ok, recent} = call(node, {:compile, distinct_program(300)})
      assert %{compiles: 302, cache_hits: 1} = info(node)
      :ok = call(node, {:free, recent})

      # The held executable still runs.
      {bin, _} = arg = Load.f32(1, 4)
      expected = Load.plus_one(bin)
      assert {:ok, [{^expected, _}]} = call(node, {:run, kept, [arg]})

      # Without eviction each of these programs keeps about 500 KiB alive (its constant, held by
      # the executable, and its code): the 200 compiled after the first measurement add some
      # 100 MiB. With it, each new one replaces a destroyed one and RSS stays level, within the
      # allocator's noise: a few MiB alone, up to some 25 MiB beside the rest of the suite.
      # Half the growth without eviction leaves room for that noise and still fails plainly
      # when nothing is destroyed.
      growth_mib = (rss_300 - rss_100) / 1024

      assert growth_mib < 50,
             "RSS grew #{Float.round(growth_mib, 1)} MiB between 100 and 300 programs " <>
               "(#{rss_100} KiB -> #{rss_300} KiB)"
    end
  end
end
