# Prints the Erlang/OTP and Elixir releases of the BEAM that runs it, as
# "OTP 27.3.4 / Elixir 1.18.3" (scripts/test.sh and scripts/userland.sh name the releases the
# suites ran on with it).
otp = System.otp_release()
otp_version = Path.join([:code.root_dir(), "releases", otp, "OTP_VERSION"])

otp =
  case File.read(otp_version) do
    {:ok, version} -> String.trim(version)
    {:error, _} -> otp
  end

IO.write("OTP #{otp} / Elixir #{System.version()}")
