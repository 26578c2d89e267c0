//! Distribution capability flags (DFLAG_* in OTP's dist.hrl) and the set this node advertises.
//!
//! Not advertising PUBLISHED is what makes the node hidden. The atom cache (DIST_HDR_ATOM_CACHE) is
//! never advertised: peers then send atoms inline and every frame's header has zero cache refs.

pub const PUBLISHED: u64 = 0x1;
pub const EXTENDED_REFERENCES: u64 = 0x4;
pub const DIST_MONITOR: u64 = 0x8;
pub const FUN_TAGS: u64 = 0x10;
pub const DIST_MONITOR_NAME: u64 = 0x20;
pub const NEW_FUN_TAGS: u64 = 0x80;
pub const EXTENDED_PIDS_PORTS: u64 = 0x100;
pub const EXPORT_PTR_TAG: u64 = 0x200;
pub const BIT_BINARIES: u64 = 0x400;
pub const NEW_FLOATS: u64 = 0x800;
pub const UTF8_ATOMS: u64 = 0x10000;
pub const MAP_TAG: u64 = 0x20000;
pub const BIG_CREATION: u64 = 0x40000;
pub const EXIT_PAYLOAD: u64 = 0x400000;
pub const FRAGMENTS: u64 = 0x800000;
pub const HANDSHAKE_23: u64 = 0x1000000;
pub const UNLINK_ID: u64 = 0x2000000;
/// Marks a node that requires the OTP 25 mandatory set; 16#4000000 in dist.hrl
/// (erl_dist 0.8 defines it as bit 36, which is DFLAG_LOCAL_EXT in OTP 26+).
pub const MANDATORY_25_DIGEST: u64 = 0x4000000;
pub const V4_NC: u64 = 1 << 34;
pub const ALIAS: u64 = 1 << 35;
/// OTP 28+: the node handles the ALTACT_SIG_SEND control message (`0x20 << 32` in dist.h), which
/// replaces ALIAS_SEND (deprecated in OTP 28, scheduled for removal in OTP 30).
pub const ALTACT_SIG: u64 = 1 << 37;
/// OTP 29+: the node handles native records (`RECORD_EXT`; `0x40 << 32`). Not advertised: this
/// node decodes records it receives but cannot send them back as records.
pub const NATIVE_RECORDS: u64 = 1 << 38;

/// What OTP 25 requires of every peer (DFLAGS_MANDATORY_25).
pub const MANDATORY: u64 = EXTENDED_REFERENCES
    | FUN_TAGS
    | EXTENDED_PIDS_PORTS
    | UTF8_ATOMS
    | NEW_FUN_TAGS
    | BIG_CREATION
    | NEW_FLOATS
    | MAP_TAG
    | EXPORT_PTR_TAG
    | BIT_BINARIES
    | HANDSHAKE_23;

/// What this node advertises: the mandatory set plus monitors (so that `GenServer.call` sends
/// MONITOR_P and fails fast with `:noproc`), aliases (for OTP 24+ call replies) and alternate
/// action signals (their OTP 28+ form), payload exits, unlink ids, V4 node containers and
/// fragments (large messages do not stall small ones).
pub const ADVERTISED: u64 = MANDATORY
    | MANDATORY_25_DIGEST
    | DIST_MONITOR
    | DIST_MONITOR_NAME
    | ALIAS
    | ALTACT_SIG
    | EXIT_PAYLOAD
    | UNLINK_ID
    | V4_NC
    | FRAGMENTS;
