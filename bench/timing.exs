# Timing helpers shared by the benchmark scripts (bench.exs, nx_eager.exs): medians, one timed
# call, and calls of several functions interleaved in rounds, so that machine noise hits every
# side alike. Loaded with Code.require_file/2.
defmodule Bench.Timing do
  def median(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples), 2))
  def p99(samples), do: samples |> Enum.sort() |> Enum.at(div(length(samples) * 99, 100))

  @doc "Microseconds `fun` takes."
  def time(fun) do
    t0 = System.monotonic_time(:nanosecond)
    fun.()
    (System.monotonic_time(:nanosecond) - t0) / 1000
  end

  @doc """
  `rounds` rounds of `n` calls of each function in turn; the samples per function. `rotate:
  true` starts each round with the next function, so that none always follows the same one.
  """
  def interleave(funs, rounds, n, opts \\ []) do
    Enum.reduce(1..rounds, Map.new(funs, fn {k, _} -> {k, []} end), fn round, acc ->
      order = if opts[:rotate], do: rotate(funs, round), else: funs

      Enum.reduce(order, acc, fn {k, f}, acc ->
        Map.update!(acc, k, &(for(_ <- 1..n, do: time(f)) ++ &1))
      end)
    end)
  end

  defp rotate(list, by) do
    {front, back} = Enum.split(list, rem(by, length(list)))
    back ++ front
  end
end
