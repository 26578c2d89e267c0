defmodule XlaNode.Compiler.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    Supervisor.start_link([XlaNode.Compiler.Cache],
      strategy: :one_for_one,
      name: XlaNode.Compiler.Supervisor
    )
  end
end
