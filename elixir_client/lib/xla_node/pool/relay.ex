defmodule XlaNode.Pool.Relay do
  @moduledoc false

  # The callback server one attempt of a pool run names in place of the caller's: it forwards each
  # callback request to the caller's `callback_server:` and remembers that one fired.
  #
  # A run whose program calls back may go to another node when its node goes down, but only if no
  # callback fired: the callback server would otherwise serve the same call twice. The relay is
  # what tells, and it is also what makes a late request of the attempt that died harmless: the
  # attempt is closed before the run is re-sent, and requests that reach a closed relay reach no
  # process at all. Replies do not pass through it: the callback server answers the node directly
  # (the request carries the node's reply tag).
  #
  # The relay watches both sides: it ends when the caller does, and when the caller's callback
  # server goes down it exits with the same reason, which the node reports to the run at once, as
  # it would for the callback server itself.

  @doc "Starts a relay for the calling process that forwards to `target`; returns its pid."
  @spec start(pid() | {atom(), node()}) :: pid()
  def start(target) do
    caller = self()

    spawn(fn ->
      caller_monitor = Process.monitor(caller)
      target_monitor = Process.monitor(target)
      loop(target, caller_monitor, target_monitor, false)
    end)
  end

  @doc """
  Closes the relay and returns whether it forwarded anything. Requests it received before the
  close are forwarded first; later ones are dropped. A relay that is already gone counts as having
  forwarded something (nothing tells otherwise).
  """
  @spec close(pid()) :: boolean()
  def close(relay) do
    monitor = Process.monitor(relay)
    send(relay, {:close, self(), monitor})

    receive do
      {^monitor, fired} ->
        Process.demonitor(monitor, [:flush])
        fired

      {:DOWN, ^monitor, :process, _, _} ->
        true
    end
  end

  defp loop(target, caller_monitor, target_monitor, fired) do
    receive do
      {:close, from, tag} ->
        send(from, {tag, fired})

      {:DOWN, ^caller_monitor, :process, _, _} ->
        :ok

      {:DOWN, ^target_monitor, :process, _, reason} ->
        exit({:callback_server_down, target, reason})

      request
      when is_tuple(request) and tuple_size(request) > 1 and
             elem(request, 0) in [:exla_runtime_call, :exla_infeed, :exla_outfeed] ->
        send(target, request)
        loop(target, caller_monitor, target_monitor, true)

      _other ->
        loop(target, caller_monitor, target_monitor, fired)
    end
  end
end
