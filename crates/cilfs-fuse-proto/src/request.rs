//! Decoding of one request as read from /dev/fuse: the in header, the opcode's arguments and
//! the extensions. Names and data are borrowed from the buffer; every length is checked
//! against the buffer and against the header's `len`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::abi::*;
use crate::codec::{Field, Reader};
use crate::ext::Extensions;
use crate::init::Negotiated;
use crate::{Opcode, ProtoError};

impl InHeader {
    /// Decodes the header of a whole message and checks that its `len` is the message's length.
    pub fn parse(msg: &[u8]) -> Result<InHeader, ProtoError> {
        let header = InHeader::decode(msg)?;
        if header.len as usize != msg.len() {
            return Err(ProtoError::LengthMismatch {
                header_len: header.len,
                buffer_len: msg.len(),
            });
        }
        Ok(header)
    }

    /// The kernel resent this request (its first attempt may have reached the server).
    pub fn is_resend(&self) -> bool {
        self.unique & UNIQUE_RESEND != 0
    }
}

/// One decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: InHeader,
    pub op: Op<'a>,
    /// Security contexts and supplementary groups; empty unless FUSE_SECURITY_CTX or
    /// FUSE_CREATE_SUPP_GROUP was negotiated.
    pub extensions: Extensions<'a>,
}

/// A request's arguments, by opcode. The node a request is about is `header.nodeid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    Lookup {
        name: &'a OsStr,
    },
    Forget(ForgetIn),
    Getattr(GetattrIn),
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        arg: MknodIn,
        name: &'a OsStr,
    },
    Mkdir {
        arg: MkdirIn,
        name: &'a OsStr,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        arg: RenameIn,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        arg: LinkIn,
        newname: &'a OsStr,
    },
    Open(OpenIn),
    Read(ReadIn),
    Write {
        arg: WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release(ReleaseIn),
    Fsync(FsyncIn),
    /// Without FUSE_SETXATTR_EXT, `setxattr_flags` is 0.
    Setxattr {
        arg: SetxattrIn,
        name: &'a OsStr,
        value: &'a [u8],
    },
    Getxattr {
        arg: GetxattrIn,
        name: &'a OsStr,
    },
    Listxattr(GetxattrIn),
    Removexattr {
        name: &'a OsStr,
    },
    Flush(FlushIn),
    /// Kernels before 7.36 send 16 bytes: `flags2` and `unused` are then 0.
    Init(InitIn),
    Opendir(OpenIn),
    Readdir(ReadIn),
    Releasedir(ReleaseIn),
    Fsyncdir(FsyncIn),
    Getlk(LkIn),
    Setlk(LkIn),
    Setlkw(LkIn),
    Access(AccessIn),
    Create {
        arg: CreateIn,
        name: &'a OsStr,
    },
    Interrupt(InterruptIn),
    Bmap(BmapIn),
    Destroy,
    Ioctl {
        arg: IoctlIn,
        data: &'a [u8],
    },
    Poll(PollIn),
    /// The page data answering a FUSE_NOTIFY_RETRIEVE; `header.unique` is its notify_unique.
    NotifyReply {
        arg: NotifyRetrieveIn,
        data: &'a [u8],
    },
    BatchForget(ForgetList<'a>),
    Fallocate(FallocateIn),
    Readdirplus(ReadIn),
    Rename2 {
        arg: Rename2In,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Lseek(LseekIn),
    CopyFileRange(CopyFileRangeIn),
    Syncfs(SyncfsIn),
    Tmpfile {
        arg: CreateIn,
        name: &'a OsStr,
    },
    Statx(StatxIn),
    CopyFileRange64(CopyFileRangeIn),
    /// A known opcode whose arguments are not decoded (DAX mappings, CUSE): answer ENOSYS.
    Unsupported {
        opcode: Opcode,
        body: &'a [u8],
    },
    /// An opcode this protocol version does not define: answer ENOSYS.
    Unknown {
        opcode: u32,
        body: &'a [u8],
    },
}

/// BATCH_FORGET's entries, checked to fill the message exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForgetList<'a> {
    bytes: &'a [u8],
}

impl<'a> ForgetList<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / ForgetOne::SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = ForgetOne> + 'a {
        // Every chunk is whole (checked at parse), so decode cannot fail here.
        self.bytes
            .chunks_exact(ForgetOne::SIZE)
            .filter_map(|chunk| ForgetOne::decode(chunk).ok())
    }
}

impl<'a> Request<'a> {
    /// Decodes one message as read from /dev/fuse, in a session that negotiated
    /// [`Negotiated::LATEST`]. Use [`Request::parse_with`] once INIT has been answered
    /// otherwise.
    pub fn parse(msg: &'a [u8]) -> Result<Request<'a>, ProtoError> {
        Self::parse_with(msg, &Negotiated::LATEST)
    }

    /// Decodes one message with the layouts `session` implies. On an error, the daemon can
    /// still answer if [`InHeader::parse`] succeeds on the same bytes (EINVAL, say).
    pub fn parse_with(msg: &'a [u8], session: &Negotiated) -> Result<Request<'a>, ProtoError> {
        let header = InHeader::parse(msg)?;
        let body = &msg[InHeader::SIZE..];
        let extension_bytes = usize::from(header.total_extlen) * 8;
        let Some(args_len) = body.len().checked_sub(extension_bytes) else {
            return Err(ProtoError::ExtensionOverrun {
                extension_bytes,
                body_len: body.len(),
            });
        };
        let (args, ext) = body.split_at(args_len);
        let op = Op::decode(header.opcode, args, session)?;
        let extensions = Extensions::parse(ext)?;
        Ok(Request {
            header,
            op,
            extensions,
        })
    }
}

fn name<'a>(r: &mut Reader<'a>) -> Result<&'a OsStr, ProtoError> {
    r.cstr().map(OsStr::from_bytes)
}

/// Trailing data whose length a field of the arguments declares.
fn data<'a>(r: &mut Reader<'a>, what: &'static str, declared: u32) -> Result<&'a [u8], ProtoError> {
    let data = r.rest();
    if data.len() as u64 != u64::from(declared) {
        return Err(ProtoError::DataLength {
            what,
            declared: u64::from(declared),
            actual: data.len(),
        });
    }
    Ok(data)
}

impl<'a> Op<'a> {
    fn decode(opcode: u32, args: &'a [u8], session: &Negotiated) -> Result<Op<'a>, ProtoError> {
        let Some(known) = Opcode::from_u32(opcode) else {
            return Ok(Op::Unknown { opcode, body: args });
        };
        let r = &mut Reader::new(args, known.name());
        let op = match known {
            Opcode::Lookup => Op::Lookup { name: name(r)? },
            Opcode::Forget => Op::Forget(Field::get(r)?),
            Opcode::Getattr => Op::Getattr(Field::get(r)?),
            Opcode::Setattr => Op::Setattr(Field::get(r)?),
            Opcode::Readlink => Op::Readlink,
            Opcode::Symlink => Op::Symlink {
                name: name(r)?,
                target: name(r)?,
            },
            Opcode::Mknod => Op::Mknod {
                arg: Field::get(r)?,
                name: name(r)?,
            },
            Opcode::Mkdir => Op::Mkdir {
                arg: Field::get(r)?,
                name: name(r)?,
            },
            Opcode::Unlink => Op::Unlink { name: name(r)? },
            Opcode::Rmdir => Op::Rmdir { name: name(r)? },
            Opcode::Rename => Op::Rename {
                arg: Field::get(r)?,
                name: name(r)?,
                newname: name(r)?,
            },
            Opcode::Link => Op::Link {
                arg: Field::get(r)?,
                newname: name(r)?,
            },
            Opcode::Open => Op::Open(Field::get(r)?),
            Opcode::Read => Op::Read(Field::get(r)?),
            Opcode::Write => {
                let arg: WriteIn = Field::get(r)?;
                let data = data(r, "FUSE_WRITE data", arg.size)?;
                Op::Write { arg, data }
            }
            Opcode::Statfs => Op::Statfs,
            Opcode::Release => Op::Release(Field::get(r)?),
            Opcode::Fsync => Op::Fsync(Field::get(r)?),
            Opcode::Setxattr => {
                let arg = if session.setxattr_ext() {
                    SetxattrIn::get(r)?
                } else {
                    SetxattrIn {
                        size: Field::get(r)?,
                        flags: Field::get(r)?,
                        ..SetxattrIn::default()
                    }
                };
                let name = name(r)?;
                let value = data(r, "FUSE_SETXATTR value", arg.size)?;
                Op::Setxattr { arg, name, value }
            }
            Opcode::Getxattr => Op::Getxattr {
                arg: Field::get(r)?,
                name: name(r)?,
            },
            Opcode::Listxattr => Op::Listxattr(Field::get(r)?),
            Opcode::Removexattr => Op::Removexattr { name: name(r)? },
            Opcode::Flush => Op::Flush(Field::get(r)?),
            Opcode::Init => Op::Init(decode_init(r)?),
            Opcode::Opendir => Op::Opendir(Field::get(r)?),
            Opcode::Readdir => Op::Readdir(Field::get(r)?),
            Opcode::Releasedir => Op::Releasedir(Field::get(r)?),
            Opcode::Fsyncdir => Op::Fsyncdir(Field::get(r)?),
            Opcode::Getlk => Op::Getlk(Field::get(r)?),
            Opcode::Setlk => Op::Setlk(Field::get(r)?),
            Opcode::Setlkw => Op::Setlkw(Field::get(r)?),
            Opcode::Access => Op::Access(Field::get(r)?),
            Opcode::Create => Op::Create {
                arg: Field::get(r)?,
                name: name(r)?,
            },
            Opcode::Interrupt => Op::Interrupt(Field::get(r)?),
            Opcode::Bmap => Op::Bmap(Field::get(r)?),
            Opcode::Destroy => Op::Destroy,
            Opcode::Ioctl => {
                let arg: IoctlIn = Field::get(r)?;
                let data = data(r, "FUSE_IOCTL data", arg.in_size)?;
                Op::Ioctl { arg, data }
            }
            Opcode::Poll => Op::Poll(Field::get(r)?),
            Opcode::NotifyReply => {
                let arg: NotifyRetrieveIn = Field::get(r)?;
                let data = data(r, "FUSE_NOTIFY_REPLY data", arg.size)?;
                Op::NotifyReply { arg, data }
            }
            Opcode::BatchForget => {
                let arg: BatchForgetIn = Field::get(r)?;
                let bytes = r.rest();
                let declared = u64::from(arg.count) * ForgetOne::SIZE as u64;
                if bytes.len() as u64 != declared {
                    return Err(ProtoError::DataLength {
                        what: "FUSE_BATCH_FORGET entries",
                        declared,
                        actual: bytes.len(),
                    });
                }
                Op::BatchForget(ForgetList { bytes })
            }
            Opcode::Fallocate => Op::Fallocate(Field::get(r)?),
            Opcode::Readdirplus => Op::Readdirplus(Field::get(r)?),
            Opcode::Rename2 => Op::Rename2 {
                arg: Field::get(r)?,
                name: name(r)?,
                newname: name(r)?,
            },
            Opcode::Lseek => Op::Lseek(Field::get(r)?),
            Opcode::CopyFileRange => Op::CopyFileRange(Field::get(r)?),
            Opcode::Syncfs => Op::Syncfs(Field::get(r)?),
            Opcode::Tmpfile => Op::Tmpfile {
                arg: Field::get(r)?,
                name: name(r)?,
            },
            Opcode::Statx => Op::Statx(Field::get(r)?),
            Opcode::CopyFileRange64 => Op::CopyFileRange64(Field::get(r)?),
            Opcode::SetupMapping | Opcode::RemoveMapping | Opcode::CuseInit => {
                return Ok(Op::Unsupported {
                    opcode: known,
                    body: args,
                })
            }
        };
        r.finish()?;
        Ok(op)
    }

    /// The opcode this request came with (for counters; `Unknown` has none).
    pub fn opcode(&self) -> Option<Opcode> {
        Some(match self {
            Op::Lookup { .. } => Opcode::Lookup,
            Op::Forget(_) => Opcode::Forget,
            Op::Getattr(_) => Opcode::Getattr,
            Op::Setattr(_) => Opcode::Setattr,
            Op::Readlink => Opcode::Readlink,
            Op::Symlink { .. } => Opcode::Symlink,
            Op::Mknod { .. } => Opcode::Mknod,
            Op::Mkdir { .. } => Opcode::Mkdir,
            Op::Unlink { .. } => Opcode::Unlink,
            Op::Rmdir { .. } => Opcode::Rmdir,
            Op::Rename { .. } => Opcode::Rename,
            Op::Link { .. } => Opcode::Link,
            Op::Open(_) => Opcode::Open,
            Op::Read(_) => Opcode::Read,
            Op::Write { .. } => Opcode::Write,
            Op::Statfs => Opcode::Statfs,
            Op::Release(_) => Opcode::Release,
            Op::Fsync(_) => Opcode::Fsync,
            Op::Setxattr { .. } => Opcode::Setxattr,
            Op::Getxattr { .. } => Opcode::Getxattr,
            Op::Listxattr(_) => Opcode::Listxattr,
            Op::Removexattr { .. } => Opcode::Removexattr,
            Op::Flush(_) => Opcode::Flush,
            Op::Init(_) => Opcode::Init,
            Op::Opendir(_) => Opcode::Opendir,
            Op::Readdir(_) => Opcode::Readdir,
            Op::Releasedir(_) => Opcode::Releasedir,
            Op::Fsyncdir(_) => Opcode::Fsyncdir,
            Op::Getlk(_) => Opcode::Getlk,
            Op::Setlk(_) => Opcode::Setlk,
            Op::Setlkw(_) => Opcode::Setlkw,
            Op::Access(_) => Opcode::Access,
            Op::Create { .. } => Opcode::Create,
            Op::Interrupt(_) => Opcode::Interrupt,
            Op::Bmap(_) => Opcode::Bmap,
            Op::Destroy => Opcode::Destroy,
            Op::Ioctl { .. } => Opcode::Ioctl,
            Op::Poll(_) => Opcode::Poll,
            Op::NotifyReply { .. } => Opcode::NotifyReply,
            Op::BatchForget(_) => Opcode::BatchForget,
            Op::Fallocate(_) => Opcode::Fallocate,
            Op::Readdirplus(_) => Opcode::Readdirplus,
            Op::Rename2 { .. } => Opcode::Rename2,
            Op::Lseek(_) => Opcode::Lseek,
            Op::CopyFileRange(_) => Opcode::CopyFileRange,
            Op::Syncfs(_) => Opcode::Syncfs,
            Op::Tmpfile { .. } => Opcode::Tmpfile,
            Op::Statx(_) => Opcode::Statx,
            Op::CopyFileRange64(_) => Opcode::CopyFileRange64,
            Op::Unsupported { opcode, .. } => *opcode,
            Op::Unknown { .. } => return None,
        })
    }

    /// Whether the kernel waits for an answer. FORGET and BATCH_FORGET are never answered;
    /// an INTERRUPT may be (EAGAIN asks for it again, ENOSYS stops interrupts) but need not be.
    pub fn expects_reply(&self) -> bool {
        !matches!(self, Op::Forget(_) | Op::BatchForget(_) | Op::Interrupt(_))
    }
}

/// INIT is the one request sent before versions are agreed: kernels before 7.36 send 16 bytes,
/// later ones 64. Anything between is refused; bytes past 64 are a newer kernel's additions
/// and are left unread, as the version rules say to ignore what is not understood.
fn decode_init(r: &mut Reader<'_>) -> Result<InitIn, ProtoError> {
    if r.remaining() == COMPAT_INIT_IN_SIZE {
        return Ok(InitIn {
            major: Field::get(r)?,
            minor: Field::get(r)?,
            max_readahead: Field::get(r)?,
            flags: Field::get(r)?,
            ..InitIn::default()
        });
    }
    let init = InitIn::get(r)?;
    r.rest();
    Ok(init)
}

impl GetattrIn {
    /// The file handle, when the kernel asks about an open file.
    pub fn fh(&self) -> Option<u64> {
        (self.getattr_flags & crate::flags::getattr::FH != 0).then_some(self.fh)
    }
}

impl SetattrIn {
    /// The server must clear set-user-ID/set-group-ID as the VFS would (HANDLE_KILLPRIV_V2).
    pub fn kill_suidgid(&self) -> bool {
        self.valid & crate::flags::fattr::KILL_SUIDGID != 0
    }
}

impl WriteIn {
    /// The server must clear set-user-ID/set-group-ID (HANDLE_KILLPRIV_V2).
    pub fn kill_suidgid(&self) -> bool {
        self.write_flags & crate::flags::write::KILL_SUIDGID != 0
    }
}

impl OpenIn {
    /// An O_TRUNC open by a caller without CAP_FSETID: clear set-user-ID/set-group-ID.
    pub fn kill_suidgid(&self) -> bool {
        self.open_flags & crate::flags::open_in::KILL_SUIDGID != 0
    }
}

impl CreateIn {
    /// As [`OpenIn::kill_suidgid`].
    pub fn kill_suidgid(&self) -> bool {
        self.open_flags & crate::flags::open_in::KILL_SUIDGID != 0
    }
}

impl SetxattrIn {
    /// Setting `system.posix_acl_access` must clear set-group-ID (only with SETXATTR_EXT).
    pub fn acl_kill_sgid(&self) -> bool {
        self.setxattr_flags & crate::flags::setxattr::ACL_KILL_SGID != 0
    }
}
