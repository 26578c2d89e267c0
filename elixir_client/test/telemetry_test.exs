defmodule XlaNode.TelemetryTest do
  use ExUnit.Case, async: true

  doctest XlaNode.Telemetry
end
