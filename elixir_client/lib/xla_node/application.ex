defmodule XlaNode.Application do
  @moduledoc false
  # Starts what the client keeps running: the server that sends the frees a process noted with
  # `XlaNode.free_later/1` once it exits or falls idle (`XlaNode.Frees`), the process that holds
  # buffers while any process holds their tokens (`XlaNode.Keeper`), and the table of which
  # module and function each process builds with `XlaNode.MLIR` (`XlaNode.MLIR.Builders`).
  use Application

  @impl true
  def start(_type, _args) do
    Supervisor.start_link([XlaNode.Frees, XlaNode.Keeper, XlaNode.MLIR.Builders],
      strategy: :one_for_one,
      name: XlaNode.Supervisor
    )
  end
end
