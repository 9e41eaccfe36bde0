//! bpf(2) and SO_ATTACH_REUSEPORT_{E,C}BPF syscalls for connection-ID steering.
//!
//! What lives here: the eBPF instruction encoding ([`Insn`] and its constructors, after
//! `struct bpf_insn` in `linux/bpf.h`), the classic BPF encoding ([`CbpfInsn`], `struct
//! sock_filter` in `linux/filter.h`), and thin wrappers around the syscalls that create a
//! `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`, fill it with sockets, load a `BPF_PROG_TYPE_SK_REUSEPORT`
//! program and attach either kind of program to a SO_REUSEPORT group. The programs themselves
//! (which bytes they read, what they return) are built in [`crate::net::steering`].
//!
//! Every file descriptor is an [`OwnedFd`], closed on drop. The kernel keeps its own references
//! (the group holds the program, the program holds the map), so dropping them after attaching
//! does not detach anything; the caller keeps them only to own them explicitly.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `bpf(2)` command numbers (`enum bpf_cmd`).
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;

/// `enum bpf_map_type`: an array of SO_REUSEPORT sockets.
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
/// `enum bpf_prog_type`: a program that selects a socket within a SO_REUSEPORT group.
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
/// `BPF_MAP_UPDATE_ELEM` flag: create or replace.
const BPF_ANY: u64 = 0;

/// `setsockopt(SOL_SOCKET, ..)` option that attaches a classic BPF reuseport program.
/// (Not exported by the libc crate for Linux; the value is in `asm-generic/socket.h`.)
pub const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
/// `setsockopt(SOL_SOCKET, ..)` option that attaches an eBPF reuseport program by fd.
pub const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// Size of the buffer that receives the verifier log when a load fails.
pub const VERIFIER_LOG_BYTES: usize = 64 * 1024;
/// Largest eBPF program this module loads (the steering program has about 25 instructions).
pub const EBPF_INSNS_MAX: usize = 4096;
/// Largest classic BPF program the kernel accepts (`BPF_MAXINSNS`).
pub const CBPF_INSNS_MAX: usize = 4096;

/// Errors of the bpf(2) and attach syscalls.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// `bpf(BPF_MAP_CREATE)` failed (EPERM without CAP_BPF, ENOMEM under a memlock limit).
    #[error("bpf(BPF_MAP_CREATE) for a reuseport socket array failed: {0}")]
    MapCreate(#[source] io::Error),
    /// `bpf(BPF_MAP_UPDATE_ELEM)` refused a socket (not bound, not SO_REUSEPORT, wrong type).
    #[error("bpf(BPF_MAP_UPDATE_ELEM) for socket index {index} failed: {source}")]
    MapUpdate {
        /// The map index (the core) being set.
        index: u32,
        /// The syscall's error.
        #[source]
        source: io::Error,
    },
    /// `bpf(BPF_PROG_LOAD)` failed; `log` holds the verifier's explanation when it gave one.
    #[error("bpf(BPF_PROG_LOAD) failed: {}; verifier log: {log:?}", io::Error::from_raw_os_error(*errno))]
    ProgLoad {
        /// The errno of the load.
        errno: i32,
        /// The verifier log of a second load attempt with logging on (may be empty).
        log: String,
    },
    /// `setsockopt(SO_ATTACH_REUSEPORT_*)` failed.
    #[error("setsockopt({option}) failed: {source}")]
    Attach {
        /// The option's name.
        option: &'static str,
        /// The syscall's error.
        #[source]
        source: io::Error,
    },
    /// A program is longer than the limit for its kind.
    #[error("program of {insns} instructions exceeds the limit of {max}")]
    ProgramTooLong {
        /// Instructions in the program.
        insns: usize,
        /// The limit.
        max: usize,
    },
}

/// One eBPF instruction, laid out as `struct bpf_insn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    /// Opcode: class | size/op | mode/source.
    pub code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high nibble (little-endian bitfields).
    pub regs: u8,
    /// Signed offset: memory displacement or jump distance (in instructions, from the next one).
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

const _: () = assert!(size_of::<Insn>() == 8);

/// eBPF registers: r0 return value, r1..r5 arguments (clobbered by calls), r6..r9 callee-saved,
/// r10 read-only frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reg {
    R0 = 0,
    R1 = 1,
    R2 = 2,
    R3 = 3,
    R4 = 4,
    R5 = 5,
    R6 = 6,
    R7 = 7,
    R8 = 8,
    R9 = 9,
    R10 = 10,
}

/// eBPF opcode parts (`linux/bpf_common.h`, `linux/bpf.h`).
pub mod op {
    /// Instruction classes.
    pub const LD: u8 = 0x00;
    /// Load into register from memory.
    pub const LDX: u8 = 0x01;
    /// Store immediate to memory.
    pub const ST: u8 = 0x02;
    /// Store register to memory.
    pub const STX: u8 = 0x03;
    /// 64-bit jumps.
    pub const JMP: u8 = 0x05;
    /// 64-bit arithmetic.
    pub const ALU64: u8 = 0x07;
    /// Sizes.
    pub const W: u8 = 0x00;
    /// Half word.
    pub const H: u8 = 0x08;
    /// Byte.
    pub const B: u8 = 0x10;
    /// Double word.
    pub const DW: u8 = 0x18;
    /// Modes.
    pub const IMM: u8 = 0x00;
    /// Memory at register + offset.
    pub const MEM: u8 = 0x60;
    /// Source: immediate.
    pub const K: u8 = 0x00;
    /// Source: register.
    pub const X: u8 = 0x08;
    /// ALU operations.
    pub const ADD: u8 = 0x00;
    /// Bitwise and.
    pub const AND: u8 = 0x50;
    /// Logical right shift.
    pub const RSH: u8 = 0x70;
    /// Move.
    pub const MOV: u8 = 0xb0;
    /// Jump operations.
    pub const JEQ: u8 = 0x10;
    /// Jump if greater or equal (unsigned).
    pub const JGE: u8 = 0x30;
    /// Jump if not equal.
    pub const JNE: u8 = 0x50;
    /// Call a helper.
    pub const CALL: u8 = 0x80;
    /// Return r0.
    pub const EXIT: u8 = 0x90;
    /// `src_reg` of a 64-bit immediate load that names a map by fd.
    pub const PSEUDO_MAP_FD: u8 = 1;
}

impl Insn {
    const fn new(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Self {
        Self { code, regs: (dst as u8) | ((src as u8) << 4), off, imm }
    }

    /// `dst = src` (64-bit).
    pub const fn mov64_reg(dst: Reg, src: Reg) -> Self {
        Self::new(op::ALU64 | op::MOV | op::X, dst, src, 0, 0)
    }

    /// `dst = imm` (64-bit, sign-extended).
    pub const fn mov64_imm(dst: Reg, imm: i32) -> Self {
        Self::new(op::ALU64 | op::MOV | op::K, dst, Reg::R0, 0, imm)
    }

    /// `dst = dst <alu_op> imm` (64-bit).
    pub const fn alu64_imm(alu_op: u8, dst: Reg, imm: i32) -> Self {
        Self::new(op::ALU64 | alu_op | op::K, dst, Reg::R0, 0, imm)
    }

    /// `dst = *(size *)(src + off)`.
    pub const fn ldx_mem(size: u8, dst: Reg, src: Reg, off: i16) -> Self {
        Self::new(op::LDX | size | op::MEM, dst, src, off, 0)
    }

    /// `*(size *)(dst + off) = src`.
    pub const fn stx_mem(size: u8, dst: Reg, src: Reg, off: i16) -> Self {
        Self::new(op::STX | size | op::MEM, dst, src, off, 0)
    }

    /// `*(size *)(dst + off) = imm`.
    pub const fn st_mem(size: u8, dst: Reg, off: i16, imm: i32) -> Self {
        Self::new(op::ST | size | op::MEM, dst, Reg::R0, off, imm)
    }

    /// `if dst <jmp_op> imm goto pc + 1 + off`.
    pub const fn jmp_imm(jmp_op: u8, dst: Reg, imm: i32, off: i16) -> Self {
        Self::new(op::JMP | jmp_op | op::K, dst, Reg::R0, off, imm)
    }

    /// `r0 = helper(r1, .., r5)`.
    pub const fn call(helper: i32) -> Self {
        Self::new(op::JMP | op::CALL, Reg::R0, Reg::R0, 0, helper)
    }

    /// `return r0`.
    pub const fn exit() -> Self {
        Self::new(op::JMP | op::EXIT, Reg::R0, Reg::R0, 0, 0)
    }

    /// `dst = map` (two instructions: a 64-bit immediate load whose `src_reg` says "map fd").
    pub const fn ld_map_fd(dst: Reg, map_fd: RawFd) -> [Self; 2] {
        [
            Self {
                code: op::LD | op::DW | op::IMM,
                regs: (dst as u8) | (op::PSEUDO_MAP_FD << 4),
                off: 0,
                imm: map_fd,
            },
            Self { code: 0, regs: 0, off: 0, imm: 0 },
        ]
    }
}

/// One classic BPF instruction (`struct sock_filter`).
pub type CbpfInsn = libc::sock_filter;

/// Classic BPF opcode parts (`linux/filter.h`, `linux/bpf_common.h`).
pub mod cop {
    /// Class: load into A.
    pub const LD: u16 = 0x00;
    /// Class: ALU on A.
    pub const ALU: u16 = 0x04;
    /// Class: jump.
    pub const JMP: u16 = 0x05;
    /// Class: return.
    pub const RET: u16 = 0x06;
    /// Size: word.
    pub const W: u16 = 0x00;
    /// Size: byte.
    pub const B: u16 = 0x10;
    /// Mode: absolute offset into the packet.
    pub const ABS: u16 = 0x20;
    /// Mode: packet length.
    pub const LEN: u16 = 0x80;
    /// ALU: and.
    pub const AND: u16 = 0x50;
    /// ALU: right shift.
    pub const RSH: u16 = 0x70;
    /// Jump if A == k.
    pub const JEQ: u16 = 0x10;
    /// Jump if A >= k (unsigned).
    pub const JGE: u16 = 0x30;
    /// Source: constant k.
    pub const K: u16 = 0x00;
    /// Source / return: A.
    pub const A: u16 = 0x10;
}

/// Builds a classic BPF instruction.
pub const fn cbpf(code: u16, jt: u8, jf: u8, k: u32) -> CbpfInsn {
    libc::sock_filter { code, jt, jf, k }
}

/// A `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`: index (u32) -> socket (u64 fd on update).
#[derive(Debug)]
pub struct ReuseportSockArray {
    fd: OwnedFd,
    max_entries: u32,
}

/// `union bpf_attr` for `BPF_MAP_CREATE` (a prefix of it; the kernel zero-fills the rest).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_MAP_*_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_LOAD` (up to `expected_attach_type`).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

const _: () = assert!(size_of::<MapCreateAttr>() == 44);
const _: () = assert!(size_of::<MapElemAttr>() == 32);
const _: () = assert!(size_of::<ProgLoadAttr>() == 72);

/// Copies `name` into a NUL-terminated 16-byte object name (truncated to 15 bytes).
fn object_name(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(name.bytes().take(15)) {
        *o = b;
    }
    out
}

/// Calls `bpf(cmd, attr, size_of::<T>())`; returns the non-negative result.
///
/// # Safety
/// `attr` must be the attribute layout the kernel expects for `cmd`, and every pointer in it
/// must be valid for the access the command performs for the duration of the call.
unsafe fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees that `attr` matches `cmd` and that the pointers it holds are
    // valid; `attr` itself is a live, exclusively borrowed object of `size_of::<T>()` bytes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Wraps a file descriptor just returned by the kernel.
fn owned_fd(ret: libc::c_long) -> io::Result<OwnedFd> {
    let raw = RawFd::try_from(ret).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: `raw` is a new descriptor the kernel returned to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl ReuseportSockArray {
    /// Creates a map with room for `max_entries` sockets (index = core).
    pub fn create(max_entries: u32) -> Result<Self, BpfError> {
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_REUSEPORT_SOCKARRAY,
            key_size: size_of::<u32>() as u32,
            value_size: size_of::<u64>() as u32,
            max_entries,
            map_name: object_name("felix_cores"),
            ..MapCreateAttr::default()
        };
        // SAFETY: `MapCreateAttr` is the BPF_MAP_CREATE layout and holds no pointers.
        let ret = unsafe { sys_bpf(BPF_MAP_CREATE, &mut attr) }.map_err(BpfError::MapCreate)?;
        let fd = owned_fd(ret).map_err(BpfError::MapCreate)?;
        Ok(Self { fd, max_entries })
    }

    /// Puts `socket` (bound, SO_REUSEPORT, in the group) at `index`.
    pub fn set(&self, index: u32, socket: BorrowedFd<'_>) -> Result<(), BpfError> {
        let key: u32 = index;
        let value: u64 = u64::try_from(socket.as_raw_fd()).map_err(|_| BpfError::MapUpdate {
            index,
            source: io::Error::from_raw_os_error(libc::EBADF),
        })?;
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: &value as *const u64 as u64,
            flags: BPF_ANY,
            ..MapElemAttr::default()
        };
        // SAFETY: `MapElemAttr` is the BPF_MAP_UPDATE_ELEM layout; `key` and `value` are live
        // locals of the map's key_size (4) and value_size (8) for the duration of the call.
        unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }
            .map(drop)
            .map_err(|source| BpfError::MapUpdate { index, source })
    }

    /// The map's file descriptor (for [`Insn::ld_map_fd`]).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The capacity given at creation.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }
}

/// Loads `insns` as a `BPF_PROG_TYPE_SK_REUSEPORT` program named `name`.
///
/// On failure the load is repeated with the verifier log on, and the log is returned in
/// [`BpfError::ProgLoad`].
pub fn load_sk_reuseport(insns: &[Insn], name: &str) -> Result<OwnedFd, BpfError> {
    if insns.len() > EBPF_INSNS_MAX {
        return Err(BpfError::ProgramTooLong { insns: insns.len(), max: EBPF_INSNS_MAX });
    }
    // Not GPL: neither helper the steering program calls (skb_load_bytes, sk_select_reuseport)
    // is GPL-only, so the project's own licence is stated truthfully.
    let license = c"Apache-2.0";
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_SK_REUSEPORT,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: object_name(name),
        ..ProgLoadAttr::default()
    };
    // SAFETY: `ProgLoadAttr` is the BPF_PROG_LOAD layout; `insns` (insn_cnt entries of the
    // `struct bpf_insn` layout) and the NUL-terminated `license` outlive the call; no log buffer.
    let first = unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) };
    let errno = match first {
        Ok(ret) => {
            return owned_fd(ret).map_err(|e| BpfError::ProgLoad {
                errno: e.raw_os_error().unwrap_or(0),
                log: String::new(),
            })
        }
        Err(e) => e.raw_os_error().unwrap_or(0),
    };
    let mut log = vec![0u8; VERIFIER_LOG_BYTES];
    attr.log_level = 1;
    attr.log_size = log.len() as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    // SAFETY: as above, plus `log` is a live, writable buffer of `log_size` bytes.
    let second = unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) };
    if let Ok(ret) = second {
        // Loaded on the second try (a transient failure such as EAGAIN): use it.
        return owned_fd(ret).map_err(|e| BpfError::ProgLoad {
            errno: e.raw_os_error().unwrap_or(0),
            log: String::new(),
        });
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Err(BpfError::ProgLoad {
        errno,
        log: String::from_utf8_lossy(&log[..end]).trim_end().to_owned(),
    })
}

/// Attaches a loaded SK_REUSEPORT program to the SO_REUSEPORT group of `socket`.
pub fn attach_reuseport_ebpf(socket: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), BpfError> {
    let prog_fd: libc::c_int = prog.as_raw_fd();
    // SAFETY: `socket` is a live descriptor; the option value is a c_int of the given length.
    let ret = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            &prog_fd as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(BpfError::Attach {
            option: "SO_ATTACH_REUSEPORT_EBPF",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Attaches a classic BPF program to the SO_REUSEPORT group of `socket`; its return value is
/// the index of the chosen socket in the group (bind order), >= group size meaning "hash".
pub fn attach_reuseport_cbpf(socket: BorrowedFd<'_>, filter: &[CbpfInsn]) -> Result<(), BpfError> {
    let len = u16::try_from(filter.len())
        .ok()
        .filter(|&n| usize::from(n) <= CBPF_INSNS_MAX)
        .ok_or(BpfError::ProgramTooLong { insns: filter.len(), max: CBPF_INSNS_MAX })?;
    let fprog = libc::sock_fprog {
        len,
        // The kernel only reads the program; the field is `*mut` in the C header.
        filter: filter.as_ptr() as *mut CbpfInsn,
    };
    // SAFETY: `socket` is a live descriptor; `fprog` is a `struct sock_fprog` pointing at `len`
    // instructions that outlive the call (the kernel copies them).
    let ret = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(BpfError::Attach {
            option: "SO_ATTACH_REUSEPORT_CBPF",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_match_linux_bpf_h() {
        // r6 = r1: BPF_ALU64|BPF_MOV|BPF_X = 0xbf, dst 6, src 1.
        let i = Insn::mov64_reg(Reg::R6, Reg::R1);
        assert_eq!((i.code, i.regs), (0xbf, 0x16));
        // r0 = 1: 0xb7.
        assert_eq!(Insn::mov64_imm(Reg::R0, 1).code, 0xb7);
        // r1 = *(u8 *)(r10 - 8): BPF_LDX|BPF_B|BPF_MEM = 0x71.
        let i = Insn::ldx_mem(op::B, Reg::R1, Reg::R10, -8);
        assert_eq!((i.code, i.regs, i.off), (0x71, 0xa1, -8));
        // *(u32 *)(r10 - 16) = r1: BPF_STX|BPF_W|BPF_MEM = 0x63.
        assert_eq!(Insn::stx_mem(op::W, Reg::R10, Reg::R1, -16).code, 0x63);
        // *(u64 *)(r10 - 8) = 0: BPF_ST|BPF_DW|BPF_MEM = 0x7a.
        assert_eq!(Insn::st_mem(op::DW, Reg::R10, -8, 0).code, 0x7a);
        // if r1 != 0 goto: 0x55; if r1 >= k goto: 0x35; call: 0x85; exit: 0x95.
        assert_eq!(Insn::jmp_imm(op::JNE, Reg::R1, 0, 3).code, 0x55);
        assert_eq!(Insn::jmp_imm(op::JGE, Reg::R1, 4, 3).code, 0x35);
        assert_eq!(Insn::call(82).code, 0x85);
        assert_eq!(Insn::exit().code, 0x95);
        // r2 = map fd 7: 0x18 with src_reg BPF_PSEUDO_MAP_FD, then an all-zero second half.
        let [a, b] = Insn::ld_map_fd(Reg::R2, 7);
        assert_eq!((a.code, a.regs, a.imm), (0x18, 0x12, 7));
        assert_eq!((b.code, b.regs, b.imm), (0, 0, 0));
    }

    #[test]
    fn object_names_are_truncated_and_terminated() {
        assert_eq!(&object_name("abc")[..4], b"abc\0");
        let long = object_name("a_very_long_object_name");
        assert_eq!(long[15], 0);
        assert_eq!(&long[..15], b"a_very_long_obj");
    }
}
