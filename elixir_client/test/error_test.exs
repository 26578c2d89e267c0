defmodule XlaNode.ErrorTest do
  use ExUnit.Case, async: true

  alias XlaNode.Error

  doctest XlaNode.Error

  test "Exception.message/1 puts the kind first" do
    for kind <- [:argument_error, :compile_error, :runtime_error, :noproc, :nodedown, :timeout] do
      error = %Error{kind: kind, message: "something happened"}
      assert Exception.message(error) == "#{kind}: something happened"
    end
  end

  test "raising keeps the whole message" do
    error = Error.from_reason({:runtime_error, "division by zero\nsecond line"})

    assert_raise Error, "runtime_error: division by zero\nsecond line", fn -> raise error end
  end

  test "from_reason/1" do
    assert %Error{kind: :compile_error, message: "bad"} =
             Error.from_reason({:compile_error, "bad"})

    assert %Error{kind: :bad_request, message: "x"} = Error.from_reason({:bad_request, "x"})

    assert %Error{kind: :argument_error, message: "abc"} =
             Error.from_reason({:argument_error, ~c"abc"})

    assert %Error{kind: :argument_error, message: "{1, 2}"} =
             Error.from_reason({:argument_error, {1, 2}})

    assert %Error{kind: :bad_reply, reason: {1, 2, 3}} = Error.from_reason({1, 2, 3})
  end

  test "from_exit/2 understands GenServer exit reasons" do
    server = {:xla, :xla@nowhere}

    assert %Error{kind: :noproc} =
             Error.from_exit({:noproc, {GenServer, :call, [server, :ping, 5000]}}, server)

    assert %Error{kind: :nodedown, message: msg} =
             Error.from_exit(
               {{:nodedown, :xla@nowhere}, {GenServer, :call, [server, :ping, 5]}},
               server
             )

    assert msg =~ "xla@nowhere"
    assert %Error{kind: :timeout} = Error.from_exit({:timeout, {GenServer, :call, []}}, server)
    assert %Error{kind: :nodedown} = Error.from_exit(:noconnection, server)

    assert %Error{kind: :exit, reason: :killed} =
             Error.from_exit({:killed, {GenServer, :call, []}}, server)
  end
end
