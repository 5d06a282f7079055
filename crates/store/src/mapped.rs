//! A transcript's bytes as [`Session`](crate::Session) holds them: read into memory, or (for the
//! CLI's read-only commands) a read-only map of the file, which costs neither a zeroed buffer nor a
//! copy.
//!
//! A mapped file that another program shrinks (Pi rewrites files in place) makes the next touch of
//! the lost pages raise SIGBUS. [`map`] therefore installs, once, a SIGBUS handler that ends the
//! process with a message naming the file and exit code 1 when the fault lies in one of its maps,
//! and leaves every other SIGBUS to the handler that was there before (Rust's stack-overflow
//! handler) or to the default action. A process that must never end that way (the gateway,
//! compaction) reads files with [`read_whole`](crate::session::read_whole) instead.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Bytes of a file: owned, or mapped by [`map`]. Derefs to the bytes either way.
pub struct FileBytes(Inner);

enum Inner {
    Owned(Vec<u8>),
    Mapped(Map),
}

impl Default for FileBytes {
    fn default() -> FileBytes {
        FileBytes(Inner::Owned(Vec::new()))
    }
}

impl From<Vec<u8>> for FileBytes {
    fn from(v: Vec<u8>) -> FileBytes {
        FileBytes(Inner::Owned(v))
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Owned(v) => v,
            Inner::Mapped(m) => m.bytes(),
        }
    }
}

impl FileBytes {
    /// True when the bytes are a map of the file (not a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Inner::Mapped(_))
    }
}

/// The file at `path` mapped read-only (private, populated up front), with the SIGBUS handler
/// installed first. An empty file, or one that cannot be mapped, is read into memory instead.
/// Only for processes that may end when the file shrinks under them (see the module's doc).
pub fn map(path: &std::path::Path) -> std::io::Result<FileBytes> {
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    if len == 0 || !install_handler() {
        return crate::session::read_whole(path).map(FileBytes::from);
    }
    let message = format!(
        "pincer: {} shrank while it was being read (another program rewrote it); the file was not changed, and any output so far is incomplete\n",
        path.display()
    );
    match Map::new(&file, len, message.into_bytes().into_boxed_slice()) {
        Some(m) => Ok(FileBytes(Inner::Mapped(m))),
        None => crate::session::read_whole(path).map(FileBytes::from),
    }
}

/// A live map: its address range (registered in a [`Slot`] for the handler) and the handler's
/// message for a fault in it.
struct Map {
    addr: usize,
    len: usize,
    slot: &'static Slot,
    /// What the slot's message points at; freed after the slot is.
    _message: Box<[u8]>,
}

impl Map {
    fn new(file: &std::fs::File, len: usize, message: Box<[u8]>) -> Option<Map> {
        use std::os::fd::AsRawFd;
        let slot =
            SLOTS.iter().find(|s| s.state.compare_exchange(FREE, BUSY, Ordering::AcqRel, Ordering::Relaxed).is_ok())?;
        // SAFETY: a fresh read-only private map of an open file, placed by the kernel: it aliases no
        // Rust memory. Its pages are only read while this value lives (`bytes`), and a read of a page
        // the file no longer covers raises SIGBUS, which the installed handler turns into an exit.
        #[allow(unsafe_code)]
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            slot.state.store(FREE, Ordering::Release);
            return None;
        }
        let addr = p as usize;
        slot.start.store(addr, Ordering::Relaxed);
        slot.end.store(addr + len, Ordering::Relaxed);
        slot.message.store(message.as_ptr().cast_mut(), Ordering::Relaxed);
        slot.message_len.store(message.len(), Ordering::Relaxed);
        slot.state.store(LIVE, Ordering::Release);
        Some(Map { addr, len, slot, _message: message })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `addr..addr + len` is mapped readable until `drop`, and nothing writes to it (a
        // private read-only map; a file shrinking under it faults instead, see `on_sigbus`).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.addr as *const u8, self.len)
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // Out of the handler's sight before the range goes away.
        self.slot.state.store(BUSY, Ordering::Release);
        // SAFETY: the map made in `Map::new`, unmapped once; no borrow of it outlives `self`.
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
        self.slot.state.store(FREE, Ordering::Release);
    }
}

/// One live map as the signal handler sees it (atomics only: the handler may run at any time).
struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    end: AtomicUsize,
    message: AtomicPtr<u8>,
    message_len: AtomicUsize,
}

const FREE: u8 = 0;
const BUSY: u8 = 1;
const LIVE: u8 = 2;

/// At most this many maps live at once; beyond that, files are read into memory.
static SLOTS: [Slot; 16] = [const {
    Slot {
        state: AtomicU8::new(FREE),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        message: AtomicPtr::new(std::ptr::null_mut()),
        message_len: AtomicUsize::new(0),
    }
}; 16];

/// The SIGBUS disposition found before ours: a handler address (or `SIG_DFL`/`SIG_IGN`) and
/// whether it takes `siginfo`.
static PREVIOUS: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installs [`on_sigbus`] once; false when it could not be installed (then nothing is mapped).
fn install_handler() -> bool {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with valid pointers to zero-initialised plain C structs; the previous
        // disposition is saved before ours is installed, so the handler never reads it unset.
        #[allow(unsafe_code)]
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            PREVIOUS.store(old.sa_sigaction, Ordering::Relaxed);
            PREVIOUS_SIGINFO.store(old.sa_flags & libc::SA_SIGINFO != 0, Ordering::Relaxed);
            let mut new: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_sigbus;
            new.sa_sigaction = handler as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    INSTALLED.load(Ordering::Acquire)
}

/// The SIGBUS handler: a fault in a live map writes its message and `_exit`s with 1; any other
/// SIGBUS goes to the previous handler, or gets the default action. Async-signal-safe: atomics,
/// `write`, `_exit`, `signal`, `raise`.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler (null is checked anyway).
    #[allow(unsafe_code)]
    let addr = if info.is_null() { 0 } else { unsafe { (*info).si_addr() as usize } };
    for slot in &SLOTS {
        if slot.state.load(Ordering::Acquire) == LIVE
            && (slot.start.load(Ordering::Relaxed)..slot.end.load(Ordering::Relaxed)).contains(&addr)
        {
            let (mut at, mut left) = (slot.message.load(Ordering::Relaxed), slot.message_len.load(Ordering::Relaxed));
            // SAFETY: the message lives as long as the slot is LIVE (it is freed after the slot is
            // released); write and _exit are async-signal-safe.
            #[allow(unsafe_code)]
            unsafe {
                while left > 0 {
                    let n = libc::write(libc::STDERR_FILENO, at.cast(), left);
                    if n <= 0 {
                        break;
                    }
                    at = at.add(n as usize);
                    left -= n as usize;
                }
                libc::_exit(1);
            }
        }
    }
    let previous = PREVIOUS.load(Ordering::Relaxed);
    // SAFETY: `previous` is the handler the process had installed for SIGBUS, called as it was
    // declared (with siginfo or not); otherwise the default action is restored and the signal raised
    // again, delivered when this handler returns (signal and raise are async-signal-safe).
    #[allow(unsafe_code)]
    unsafe {
        if previous != libc::SIG_DFL && previous != libc::SIG_IGN {
            if PREVIOUS_SIGINFO.load(Ordering::Relaxed) {
                let f = std::mem::transmute::<usize, extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)>(
                    previous,
                );
                f(sig, info, context);
            } else {
                let f = std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(previous);
                f(sig);
            }
            return;
        }
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        libc::raise(libc::SIGBUS);
    }
}
