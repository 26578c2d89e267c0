defmodule XlaNode.DocExamples do
  @moduledoc """
  Reads the code examples of a documentation text and runs them (see
  `XlaNode.DocExamplesTest`).
  """

  import ExUnit.Assertions

  @doc """
  The documentation entries of `modules` (each module's `@moduledoc`, and its functions', macros'
  and types' docs) that have examples to run, but those `not_run` names (`{module, entry}`), as
  `{module, entry, line, code}`: `entry` is `"@moduledoc"` or `"function name/arity"`, `code`
  the entry's examples, in order.
  """
  def examples(modules, not_run \\ []) do
    for module <- modules,
        {:docs_v1, anno, _, _, moduledoc, _, docs} = Code.fetch_docs(module),
        {entry, doc_anno, %{"en" => doc}} <- [{"@moduledoc", anno, moduledoc} | entries(docs)],
        {module, entry} not in not_run,
        blocks = blocks(doc),
        blocks != [] do
      {module, entry, :erl_anno.line(doc_anno), Enum.join(blocks, "\n")}
    end
  end

  defp entries(docs) do
    for {{kind, name, arity}, anno, _, doc, _} <- docs,
        do: {"#{kind} #{name}/#{arity}", anno, doc}
  end

  @doc """
  The examples of a Markdown documentation text, each as Elixir source: its indented code
  blocks (4 spaces, after a blank line, not a list's continuation) and its blocks fenced as
  `elixir` or with no language. Left out: doctests (`iex>`), fenced blocks of any other
  language, and excerpts of a file, whose first line names it (`# config/config.exs`).
  """
  def blocks(text) do
    text
    |> String.split("\n")
    |> collect(nil, [], [], "")
    |> Enum.reject(&(&1 |> String.trim_leading() |> String.starts_with?("iex>")))
    |> Enum.reject(&Regex.match?(~r{\A# [\w./-]+\.exs?\n}, &1))
  end

  # collect(lines, mode, current block lines, blocks, previous line)
  defp collect([], mode, current, blocks, _prev), do: Enum.reverse(flush(mode, current, blocks))

  defp collect([line | rest], {:fence, lang}, current, blocks, _prev) do
    if String.trim(line) == "```" do
      blocks = if lang in ["", "elixir"], do: flush(:code, current, blocks), else: blocks
      collect(rest, nil, [], blocks, line)
    else
      collect(rest, {:fence, lang}, [line | current], blocks, line)
    end
  end

  defp collect([line | rest], :indented, current, blocks, prev) do
    cond do
      String.starts_with?(line, "    ") ->
        collect(rest, :indented, [line | current], blocks, line)

      String.trim(line) == "" ->
        collect(rest, :indented, [line | current], blocks, line)

      true ->
        collect([line | rest], nil, [], flush(:indented, current, blocks), prev)
    end
  end

  defp collect([line | rest], nil, [], blocks, prev) do
    trimmed = String.trim_leading(line)

    cond do
      String.starts_with?(trimmed, "```") ->
        lang = trimmed |> String.trim_leading("`") |> String.trim()
        collect(rest, {:fence, lang}, [], blocks, line)

      String.starts_with?(line, "    ") and String.trim(prev) == "" and
          not list_item?(trimmed) ->
        collect(rest, :indented, [line], blocks, line)

      true ->
        collect(rest, nil, [], blocks, line)
    end
  end

  defp list_item?(line), do: String.starts_with?(line, ["* ", "- "])

  defp flush(nil, _current, blocks), do: blocks

  defp flush(kind, current, blocks) do
    lines = current |> Enum.reverse() |> Enum.drop_while(&(String.trim(&1) == ""))
    lines = lines |> Enum.reverse() |> Enum.drop_while(&(String.trim(&1) == "")) |> Enum.reverse()

    lines =
      if kind == :indented,
        do: Enum.map(lines, &String.replace_prefix(&1, "    ", "")),
        else: lines

    case lines do
      [] -> blocks
      _ -> [Enum.join(lines, "\n") | blocks]
    end
  end

  @doc """
  Runs `code` (an entry's examples, its `#=> value` lines turned into checks) in a fresh process
  and stops what it started linked to it; raises, naming `module` and `entry`, if it fails.
  """
  def run!(code, module, entry) do
    source = with_checks(code)
    parent = self()

    {pid, ref} =
      spawn_monitor(fn ->
        result =
          try do
            Code.eval_string(source, [], file: "#{module} #{entry}")
            :ok
          rescue
            error -> {:error, Exception.format(:error, error, __STACKTRACE__)}
          catch
            kind, reason -> {:error, Exception.format(kind, reason, __STACKTRACE__)}
          end

        {:links, links} = Process.info(self(), :links)
        send(parent, {:example_done, self(), result, links})
        exit(:shutdown)
      end)

    receive do
      {:example_done, ^pid, result, links} ->
        # What the example started linked to it stops with it: wait for that, so that the next
        # example can take the same registered names.
        monitors = for link <- links, is_pid(link), do: Process.monitor(link)

        receive do
          {:DOWN, ^ref, :process, ^pid, _} -> :ok
        end

        for monitor <- monitors do
          receive do
            {:DOWN, ^monitor, _, _, _} -> :ok
          end
        end

        case result do
          :ok ->
            :ok

          {:error, message} ->
            flunk("#{module} #{entry}: its example failed:\n#{message}\n#{source}")
        end

      {:DOWN, ^ref, :process, ^pid, reason} ->
        flunk("#{module} #{entry}: its example ended with #{inspect(reason)}:\n#{source}")
    end
  end

  # `expression` followed by `#=> value` (a literal) becomes a check of the expression's value;
  # the expression must then be the one line above. A value that is not a literal (one with
  # `...`, say) stays a comment.
  defp with_checks(code) do
    code
    |> String.split("\n")
    |> Enum.reduce([], fn line, acc ->
      with "#=> " <> expected <- String.trim_leading(line),
           {:ok, quoted} <- Code.string_to_quoted(expected),
           true <- Macro.quoted_literal?(quoted) do
        [previous | before] = acc

        unless String.trim(previous) != "" and match?({:ok, _}, Code.string_to_quoted(previous)) do
          raise ArgumentError,
                "#=> #{expected} follows #{inspect(previous)}, not a whole expression on one line"
        end

        [
          "XlaNode.DocExamples.check!((#{previous}), (#{expected}), #{inspect(previous)})"
          | before
        ]
      else
        _ -> [line | acc]
      end
    end)
    |> Enum.reverse()
    |> Enum.join("\n")
  end

  @doc false
  def check!(value, expected, expression) do
    assert value == expected,
           "#{expression}\n#=> #{inspect(value)}, where the documentation says #{inspect(expected)}"

    value
  end
end
