//! SO_REUSEPORT steering: eBPF, classic BPF, or off.
//!
//! The broker binds one UDP socket per core to the same port (one SO_REUSEPORT group, bound in
//! core order). A program attached to the group reads the destination CID of each short-header
//! datagram and picks the socket of the core the CID names ([`crate::net::cid`] defines the
//! layout); anything else (long headers, short or foreign datagrams) is left to the kernel's
//! 4-tuple hash. Correctness never depends on the program: the driver forwards datagrams that
//! reach the wrong core (see `docs/connection-ids.md`, "Safety net").
//!
//! Call order: bind all sockets, then [`attach`] once, then keep the returned [`Steering`] for
//! the life of the sockets.
//!
//! The programs are built here ([`ebpf_program`], [`cbpf_program`]); the syscalls that load and
//! attach them are in [`crate::sys::bpf`].

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::str::FromStr;

use crate::net::cid::{
    CONFIG_ID, CONFIG_ID_SHIFT, CORE_BYTE_INDEX, LONG_HEADER_BIT, MAX_STEERABLE_CORES,
};
use crate::sys::bpf::{self, cbpf, cop, op, BpfError, CbpfInsn, Insn, Reg, ReuseportSockArray};

/// Bytes from `ctx->data` (the UDP header) to the QUIC first byte in an SK_REUSEPORT program.
pub const EBPF_QUIC_OFFSET: i32 = 8;
/// Bytes of the QUIC packet the programs read: first byte, DCID byte 0, DCID core byte.
pub const STEERING_BYTES: u32 = 1 + CORE_BYTE_INDEX as u32 + 1;
/// `bpf_skb_load_bytes` helper id.
const HELPER_SKB_LOAD_BYTES: i32 = 26;
/// `bpf_sk_select_reuseport` helper id.
const HELPER_SK_SELECT_REUSEPORT: i32 = 82;
/// SK_REUSEPORT verdict: accept; with no socket selected, the kernel's hash decides.
const SK_PASS: i32 = 1;
/// Stack slot (offset from r10) the packet bytes are copied into (8 bytes, zeroed first).
const STACK_PACKET: i16 = -8;
/// Stack slot (offset from r10) of the u32 map key.
const STACK_KEY: i16 = -16;
/// Name of the loaded program (bpftool prog show).
const PROG_NAME: &str = "felix_steer";

const _: () = assert!(STEERING_BYTES == 3);
const _: () = assert!(STEERING_BYTES as i16 <= -STACK_PACKET);

/// What the operator asked for (`--steering`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SteeringMode {
    /// eBPF if the kernel and privileges allow it, else classic BPF, else off.
    #[default]
    Auto,
    /// eBPF only; failing to attach it is an error.
    Ebpf,
    /// Classic BPF only; failing to attach it is an error.
    Cbpf,
    /// No program: the kernel's 4-tuple hash spreads datagrams, the driver forwards.
    Off,
}

/// What is actually attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffectiveSteering {
    /// A `BPF_PROG_TYPE_SK_REUSEPORT` program with a socket array (index = core).
    Ebpf,
    /// A classic BPF program (index = position in bind order).
    Cbpf,
    /// Nothing attached.
    Off,
}

/// Options of [`attach_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct AttachOptions {
    /// Act as if the kernel refused the eBPF load with EPERM (tests of the fallback path).
    pub refuse_ebpf: bool,
}

/// Errors of [`attach`].
#[derive(Debug, thiserror::Error)]
pub enum SteeringError {
    /// No sockets were given.
    #[error("steering needs at least one socket")]
    NoSockets,
    /// More sockets than the CID core byte can name.
    #[error("{sockets} sockets: steering supports at most {MAX_STEERABLE_CORES}")]
    TooManySockets {
        /// The number of sockets given.
        sockets: usize,
    },
    /// `--steering ebpf` was asked for and could not be set up.
    #[error("eBPF steering failed: {0}")]
    Ebpf(#[source] BpfError),
    /// `--steering cbpf` was asked for and could not be attached.
    #[error("classic BPF steering failed: {0}")]
    Cbpf(#[source] BpfError),
}

/// The error returned by `SteeringMode::from_str`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown steering mode {0:?}: expected auto, ebpf, cbpf or off")]
pub struct ParseSteeringModeError(pub String);

/// An attached steering program; owns the program and map descriptors.
///
/// The kernel holds its own references once attached, so dropping this does not detach the
/// program; the broker keeps it for the process lifetime anyway.
#[derive(Debug)]
pub struct Steering {
    effective: EffectiveSteering,
    sockets: usize,
    ebpf_error: Option<BpfError>,
    _map: Option<ReuseportSockArray>,
    _prog: Option<OwnedFd>,
}

impl Steering {
    /// What is attached.
    pub fn effective(&self) -> EffectiveSteering {
        self.effective
    }

    /// The number of sockets (cores) in the group.
    pub fn sockets(&self) -> usize {
        self.sockets
    }

    /// Why eBPF was not used, when `Auto` fell back.
    pub fn ebpf_error(&self) -> Option<&BpfError> {
        self.ebpf_error.as_ref()
    }
}

/// Attaches steering to the SO_REUSEPORT group of `sockets` (in core order: `sockets[k]` is
/// core k's socket, bound k-th, all bound to one address with SO_REUSEPORT).
pub fn attach(sockets: &[BorrowedFd<'_>], mode: SteeringMode) -> Result<Steering, SteeringError> {
    attach_with(sockets, mode, &AttachOptions::default())
}

/// [`attach`] with options.
///
/// `Auto` tries eBPF, then classic BPF, then runs without a program, logging a warning with the
/// reason at each fallback. `Ebpf` and `Cbpf` fail instead of falling back.
pub fn attach_with(
    sockets: &[BorrowedFd<'_>],
    mode: SteeringMode,
    options: &AttachOptions,
) -> Result<Steering, SteeringError> {
    if sockets.is_empty() {
        return Err(SteeringError::NoSockets);
    }
    if sockets.len() > MAX_STEERABLE_CORES {
        return Err(SteeringError::TooManySockets { sockets: sockets.len() });
    }
    let off = |ebpf_error| Steering {
        effective: EffectiveSteering::Off,
        sockets: sockets.len(),
        ebpf_error,
        _map: None,
        _prog: None,
    };
    match mode {
        SteeringMode::Off => Ok(off(None)),
        SteeringMode::Ebpf => attach_ebpf(sockets, options).map_err(SteeringError::Ebpf),
        SteeringMode::Cbpf => attach_cbpf(sockets).map_err(SteeringError::Cbpf),
        SteeringMode::Auto => {
            let ebpf_error = match attach_ebpf(sockets, options) {
                Ok(steering) => return Ok(steering),
                Err(e) => e,
            };
            tracing::warn!(error = %ebpf_error, "eBPF steering unavailable; trying classic BPF");
            match attach_cbpf(sockets) {
                Ok(mut steering) => {
                    steering.ebpf_error = Some(ebpf_error);
                    Ok(steering)
                }
                Err(cbpf_error) => {
                    tracing::warn!(
                        error = %cbpf_error,
                        "classic BPF steering unavailable; running without steering \
                         (misrouted datagrams are forwarded between cores)"
                    );
                    Ok(off(Some(ebpf_error)))
                }
            }
        }
    }
}

fn socket_count(sockets: &[BorrowedFd<'_>]) -> u32 {
    // Cannot truncate: callers checked sockets.len() <= MAX_STEERABLE_CORES.
    sockets.len() as u32
}

fn attach_ebpf(sockets: &[BorrowedFd<'_>], options: &AttachOptions) -> Result<Steering, BpfError> {
    if options.refuse_ebpf {
        return Err(BpfError::ProgLoad {
            errno: libc::EPERM,
            log: "refused by AttachOptions::refuse_ebpf".to_owned(),
        });
    }
    let n = socket_count(sockets);
    let map = ReuseportSockArray::create(n)?;
    for (index, socket) in (0u32..).zip(sockets) {
        map.set(index, *socket)?;
    }
    let prog = bpf::load_sk_reuseport(&ebpf_program(map.fd().as_raw_fd(), n), PROG_NAME)?;
    bpf::attach_reuseport_ebpf(sockets[0], prog.as_fd())?;
    Ok(Steering {
        effective: EffectiveSteering::Ebpf,
        sockets: sockets.len(),
        ebpf_error: None,
        _map: Some(map),
        _prog: Some(prog),
    })
}

fn attach_cbpf(sockets: &[BorrowedFd<'_>]) -> Result<Steering, BpfError> {
    bpf::attach_reuseport_cbpf(sockets[0], &cbpf_program(socket_count(sockets)))?;
    Ok(Steering {
        effective: EffectiveSteering::Cbpf,
        sockets: sockets.len(),
        ebpf_error: None,
        _map: None,
        _prog: None,
    })
}

/// The eBPF steering program for a group of `sockets` sockets whose socket array is `map_fd`.
///
/// It copies 3 bytes with `bpf_skb_load_bytes` rather than reading the packet directly: direct
/// access only reaches `data_end`, the end of the skb's linear part, and drivers that put UDP
/// payloads in page fragments would then make every bounds check fail and silently turn
/// steering off; the helper reads through fragments, as classic BPF loads do. Listing with
/// comments: `docs/connection-ids.md`.
pub fn ebpf_program(map_fd: RawFd, sockets: u32) -> Vec<Insn> {
    let mut p = ProgramBuilder::default();
    // r6 = ctx; r1..r5 are clobbered by helper calls.
    p.push(Insn::mov64_reg(Reg::R6, Reg::R1));
    // *(u64 *)(r10 - 8) = 0: the buffer for the packet bytes starts initialised.
    p.push(Insn::st_mem(op::DW, Reg::R10, STACK_PACKET, 0));
    // bpf_skb_load_bytes(ctx = r1, offset = 8, to = r10 - 8, len = 3)
    p.push(Insn::mov64_imm(Reg::R2, EBPF_QUIC_OFFSET));
    p.push(Insn::mov64_reg(Reg::R3, Reg::R10));
    p.push(Insn::alu64_imm(op::ADD, Reg::R3, i32::from(STACK_PACKET)));
    p.push(Insn::mov64_imm(Reg::R4, STEERING_BYTES as i32));
    p.push(Insn::call(HELPER_SKB_LOAD_BYTES));
    // Fewer than 3 QUIC bytes: let the kernel hash.
    p.jump_to_pass(op::JNE, Reg::R0, 0);
    // Long header (first byte & 0x80): let the kernel hash.
    p.push(Insn::ldx_mem(op::B, Reg::R1, Reg::R10, STACK_PACKET));
    p.push(Insn::alu64_imm(op::AND, Reg::R1, i32::from(LONG_HEADER_BIT)));
    p.jump_to_pass(op::JNE, Reg::R1, 0);
    // DCID byte 0 >> 5 must be Felix's config id.
    p.push(Insn::ldx_mem(op::B, Reg::R1, Reg::R10, STACK_PACKET + 1));
    p.push(Insn::alu64_imm(op::RSH, Reg::R1, CONFIG_ID_SHIFT as i32));
    p.jump_to_pass(op::JNE, Reg::R1, i32::from(CONFIG_ID));
    // key = core byte; a core without a socket: let the kernel hash.
    p.push(Insn::ldx_mem(op::B, Reg::R1, Reg::R10, STACK_PACKET + 2));
    p.jump_to_pass(op::JGE, Reg::R1, sockets as i32);
    p.push(Insn::stx_mem(op::W, Reg::R10, Reg::R1, STACK_KEY));
    // bpf_sk_select_reuseport(ctx, map, &key, 0); its result is ignored: on failure the
    // kernel's hash decides.
    for insn in Insn::ld_map_fd(Reg::R2, map_fd) {
        p.push(insn);
    }
    p.push(Insn::mov64_reg(Reg::R1, Reg::R6));
    p.push(Insn::mov64_reg(Reg::R3, Reg::R10));
    p.push(Insn::alu64_imm(op::ADD, Reg::R3, i32::from(STACK_KEY)));
    p.push(Insn::mov64_imm(Reg::R4, 0));
    p.push(Insn::call(HELPER_SK_SELECT_REUSEPORT));
    // pass: return SK_PASS.
    p.finish_with_pass()
}

/// The classic BPF steering program for a group of `sockets` sockets. Its result is the index
/// of the socket in bind order; `sockets` (out of range) makes the kernel fall back to its hash.
///
/// The length check comes first because a classic load past the end of the packet ends the
/// program with 0, which would pick socket 0 for every runt datagram.
pub fn cbpf_program(sockets: u32) -> Vec<CbpfInsn> {
    const FALLBACK: u8 = 10;
    let to_fallback = |pc: u8| FALLBACK - pc - 1;
    vec![
        // 0: A = datagram length (UDP payload; the kernel pulled the UDP header).
        cbpf(cop::LD | cop::W | cop::LEN, 0, 0, 0),
        // 1: if A >= 3 goto 2 else fallback.
        cbpf(cop::JMP | cop::JGE | cop::K, 0, to_fallback(1), STEERING_BYTES),
        // 2: A = QUIC first byte.
        cbpf(cop::LD | cop::B | cop::ABS, 0, 0, 0),
        // 3: if A & 0x80 (long header) goto fallback.
        cbpf(cop::JMP | JSET | cop::K, to_fallback(3), 0, u32::from(LONG_HEADER_BIT)),
        // 4: A = DCID byte 0.
        cbpf(cop::LD | cop::B | cop::ABS, 0, 0, 1),
        // 5: A >>= 5 (config rotation id).
        cbpf(cop::ALU | cop::RSH | cop::K, 0, 0, CONFIG_ID_SHIFT),
        // 6: if A == CONFIG_ID goto 7 else fallback.
        cbpf(cop::JMP | cop::JEQ | cop::K, 0, to_fallback(6), u32::from(CONFIG_ID)),
        // 7: A = DCID core byte.
        cbpf(cop::LD | cop::B | cop::ABS, 0, 0, 1 + CORE_BYTE_INDEX as u32),
        // 8: if A >= sockets goto fallback.
        cbpf(cop::JMP | cop::JGE | cop::K, to_fallback(8), 0, sockets),
        // 9: return A (the core's socket).
        cbpf(cop::RET | cop::A, 0, 0, 0),
        // 10: fallback: return sockets (out of range: the kernel hashes).
        cbpf(cop::RET | cop::K, 0, 0, sockets),
    ]
}

/// `BPF_JSET`: jump if A & k != 0.
const JSET: u16 = 0x40;

/// Collects eBPF instructions and resolves jumps to the final "return SK_PASS".
#[derive(Default)]
struct ProgramBuilder {
    insns: Vec<Insn>,
    pass_jumps: Vec<usize>,
}

impl ProgramBuilder {
    fn push(&mut self, insn: Insn) {
        self.insns.push(insn);
    }

    /// `if reg <jmp_op> imm goto pass`.
    fn jump_to_pass(&mut self, jmp_op: u8, reg: Reg, imm: i32) {
        self.pass_jumps.push(self.insns.len());
        self.insns.push(Insn::jmp_imm(jmp_op, reg, imm, 0));
    }

    fn finish_with_pass(mut self) -> Vec<Insn> {
        let pass = self.insns.len();
        for &pc in &self.pass_jumps {
            // Cannot overflow: the program has a few dozen instructions.
            self.insns[pc].off = (pass - pc - 1) as i16;
        }
        self.insns.push(Insn::mov64_imm(Reg::R0, SK_PASS));
        self.insns.push(Insn::exit());
        self.insns
    }
}

impl fmt::Display for SteeringMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Ebpf => "ebpf",
            Self::Cbpf => "cbpf",
            Self::Off => "off",
        })
    }
}

impl FromStr for SteeringMode {
    type Err = ParseSteeringModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "ebpf" => Ok(Self::Ebpf),
            "cbpf" => Ok(Self::Cbpf),
            "off" => Ok(Self::Off),
            _ => Err(ParseSteeringModeError(s.to_owned())),
        }
    }
}

impl fmt::Display for EffectiveSteering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ebpf => "ebpf",
            Self::Cbpf => "cbpf",
            Self::Off => "off",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::cid::{
        check_value, core_of_datagram, steered_core_of_datagram, CHECK_BYTE_INDEX, CID_LEN,
    };
    use felix_proto::CoreId;

    #[test]
    fn mode_parse_and_display_round_trip() {
        for m in [SteeringMode::Auto, SteeringMode::Ebpf, SteeringMode::Cbpf, SteeringMode::Off] {
            assert_eq!(m.to_string().parse::<SteeringMode>(), Ok(m));
        }
        assert_eq!("EBPF".parse::<SteeringMode>(), Ok(SteeringMode::Ebpf));
        assert!("bpf".parse::<SteeringMode>().is_err());
    }

    #[test]
    fn ebpf_jumps_land_on_pass() {
        let prog = ebpf_program(3, 4);
        let n = prog.len();
        let pass = n - 2;
        assert_eq!(prog[pass], Insn::mov64_imm(Reg::R0, SK_PASS));
        assert_eq!(prog[n - 1], Insn::exit());
        let jumps: Vec<usize> = (0..n)
            .filter(|&pc| prog[pc].code & 0x07 == op::JMP && prog[pc].code & 0xf0 != op::CALL)
            .filter(|&pc| prog[pc].code != Insn::exit().code)
            .collect();
        assert_eq!(jumps.len(), 4);
        for pc in jumps {
            assert_eq!(pc + 1 + prog[pc].off as usize, pass, "jump at {pc}");
        }
        assert!(n <= 32, "the listing in docs/connection-ids.md has {n} instructions");
    }

    #[test]
    fn ebpf_listing_matches_docs() {
        // docs/connection-ids.md, "eBPF program": map fd 5, 4 sockets.
        #[rustfmt::skip]
        let want: [(u8, u8, i16, i32); 26] = [
            (0xbf, 0x16, 0, 0),    //  0: r6 = r1
            (0x7a, 0x0a, -8, 0),   //  1: *(u64 *)(r10 - 8) = 0
            (0xb7, 0x02, 0, 8),    //  2: r2 = 8
            (0xbf, 0xa3, 0, 0),    //  3: r3 = r10
            (0x07, 0x03, 0, -8),   //  4: r3 += -8
            (0xb7, 0x04, 0, 3),    //  5: r4 = 3
            (0x85, 0x00, 0, 26),   //  6: call bpf_skb_load_bytes
            (0x55, 0x00, 16, 0),   //  7: if r0 != 0 goto 24
            (0x71, 0xa1, -8, 0),   //  8: r1 = *(u8 *)(r10 - 8)
            (0x57, 0x01, 0, 0x80), //  9: r1 &= 0x80
            (0x55, 0x01, 13, 0),   // 10: if r1 != 0 goto 24
            (0x71, 0xa1, -7, 0),   // 11: r1 = *(u8 *)(r10 - 7)
            (0x77, 0x01, 0, 5),    // 12: r1 >>= 5
            (0x55, 0x01, 10, 0),   // 13: if r1 != 0 goto 24
            (0x71, 0xa1, -6, 0),   // 14: r1 = *(u8 *)(r10 - 6)
            (0x35, 0x01, 8, 4),    // 15: if r1 >= 4 goto 24
            (0x63, 0x1a, -16, 0),  // 16: *(u32 *)(r10 - 16) = r1
            (0x18, 0x12, 0, 5),    // 17: r2 = map_by_fd(5)
            (0x00, 0x00, 0, 0),    // 18:   (second half of the 64-bit load)
            (0xbf, 0x61, 0, 0),    // 19: r1 = r6
            (0xbf, 0xa3, 0, 0),    // 20: r3 = r10
            (0x07, 0x03, 0, -16),  // 21: r3 += -16
            (0xb7, 0x04, 0, 0),    // 22: r4 = 0
            (0x85, 0x00, 0, 82),   // 23: call bpf_sk_select_reuseport
            (0xb7, 0x00, 0, 1),    // 24: r0 = SK_PASS
            (0x95, 0x00, 0, 0),    // 25: exit
        ];
        let got: Vec<_> =
            ebpf_program(5, 4).iter().map(|i| (i.code, i.regs, i.off, i.imm)).collect();
        assert_eq!(got, want);
    }

    /// Runs the classic program over `payload` as the kernel does (a load past the end
    /// returns 0), so the program's decisions can be compared with `core_of_datagram`.
    fn run_cbpf(prog: &[CbpfInsn], payload: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                c if c == cop::LD | cop::W | cop::LEN => a = payload.len() as u32,
                c if c == cop::LD | cop::B | cop::ABS => match payload.get(i.k as usize) {
                    Some(&b) => a = u32::from(b),
                    None => return 0,
                },
                c if c == cop::ALU | cop::RSH | cop::K => a >>= i.k,
                c if c == cop::JMP | cop::JGE | cop::K => {
                    pc += usize::from(if a >= i.k { i.jt } else { i.jf })
                }
                c if c == cop::JMP | cop::JEQ | cop::K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf })
                }
                c if c == cop::JMP | JSET | cop::K => {
                    pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf })
                }
                c if c == cop::RET | cop::A => return a,
                c if c == cop::RET | cop::K => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    #[test]
    fn cbpf_agrees_with_steered_core_of_datagram() {
        // The program reads the config bits and the core byte of short headers, as
        // `steered_core_of_datagram` does; every short header the safety net decodes
        // (`core_of_datagram`, which also checks the check value) goes to the same core.
        let n = 4u32;
        let prog = cbpf_program(n);
        let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0x40], vec![0x40, 0x00]];
        for first in [0x40u8, 0x41, 0xC0, 0x80] {
            for dcid0 in [0x00u8, 0x1f, 0x20, 0xE0] {
                for core in [0u8, 1, 3, 4, 200, 255] {
                    let mut d = vec![first, dcid0, core];
                    d.extend_from_slice(&[0u8; 20]);
                    cases.push(d.clone());
                    // The same CID with its check value.
                    let mut cid = [0u8; CID_LEN];
                    cid.copy_from_slice(&d[1..1 + CID_LEN]);
                    d[1 + CHECK_BYTE_INDEX] = check_value(&cid);
                    cases.push(d);
                }
            }
        }
        let (mut decoded, mut unchecked) = (0, 0);
        for d in cases {
            let want = match steered_core_of_datagram(&d) {
                Some(CoreId(c)) if u32::from(c) < n => u32::from(c),
                _ => n,
            };
            let got = run_cbpf(&prog, &d);
            assert_eq!(got, want, "datagram {d:02x?}");
            match core_of_datagram(&d, CID_LEN) {
                Some(CoreId(c)) if d[0] & LONG_HEADER_BIT == 0 && u32::from(c) < n => {
                    assert_eq!(got, u32::from(c), "datagram {d:02x?}");
                    decoded += 1;
                }
                None if got < n => unchecked += 1,
                _ => {}
            }
        }
        // Short headers (2 first bytes) with config bits 0 (2 DCID bytes 0) and a core under 4
        // (3): decoded with their check value, steered without it.
        assert_eq!((decoded, unchecked), (12, 12), "cases of each kind");
    }
}
