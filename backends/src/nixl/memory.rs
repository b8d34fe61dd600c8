//! Memory and files a NIXL agent registers.
//!
//! Owns: [`HostBuffer`] (page-aligned host DRAM at a fixed address, zeroed) and
//! [`FileRegion`] (an open file of a fixed length), and their `nixl-sys` descriptor
//! impls (DRAM: address, length, device 0; FILE: offset 0, length, the file descriptor as
//! the device id, as the POSIX backend expects).
//! Invariant: a buffer's bytes are only ever copied in and out under its lock, never
//! borrowed, since a remote agent may write them while they are registered.
//! Never: register anything itself (the agent does), or move or free memory while a
//! registration holds it (registrations keep an `Arc`).

use super::NixlError;
use kvtwin::layout::{Address, MemoryType, Region};
use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};
use std::alloc::{self, Layout};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Page-aligned, zero-initialised host memory at a fixed address, for NIXL to register.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Serialises this process's copies in and out (backends write without it).
    access: Mutex<()>,
}

// SAFETY: the buffer is plain memory owned by this value; every access from Rust copies
// under `access`, so sharing the pointer between threads races with nothing but the
// transfers the caller posts (which is what registering memory is for).
unsafe impl Send for HostBuffer {}
// SAFETY: as above: `&HostBuffer` only allows copies under the lock.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// The alignment of every buffer: a page, so any layout alignment up to it holds.
    pub const ALIGNMENT: usize = 4096;

    /// A zeroed buffer of `len` bytes (at least 1).
    pub fn new(len: usize) -> Result<Self, NixlError> {
        if len == 0 {
            return Err(NixlError::Alloc { len });
        }
        let layout =
            Layout::from_size_align(len, Self::ALIGNMENT).map_err(|_| NixlError::Alloc { len })?;
        // SAFETY: `layout` has a non-zero size (checked above).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(NixlError::Alloc { len })?;
        Ok(Self {
            ptr,
            layout,
            access: Mutex::new(()),
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Always false: buffers hold at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address of its first byte.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// The whole buffer as an absolute range.
    pub fn span(&self) -> Address {
        Address {
            addr: self.addr(),
            len: self.len() as u64,
        }
    }

    /// The buffer as a layout region of pageable host memory, for
    /// [`kvtwin::layout::FullyContiguous::new`] and the like.
    pub fn region(&self) -> Region {
        Region {
            memory_type: MemoryType::System,
            device_id: 0,
            base_addr: self.addr(),
            len: self.len() as u64,
        }
    }

    /// Checks that `len` bytes at absolute address `addr` lie in the buffer, and returns
    /// their offset.
    pub(crate) fn offset_of(&self, addr: u64, len: u64) -> Result<usize, NixlError> {
        let end = addr
            .checked_sub(self.addr())
            .and_then(|offset| Some((offset, offset.checked_add(len)?)));
        match end {
            Some((offset, end)) if end <= self.len() as u64 => Ok(offset as usize),
            _ => Err(NixlError::OutOfBounds {
                addr,
                len,
                base: self.addr(),
                capacity: self.len() as u64,
            }),
        }
    }

    /// Copies `bytes` into the buffer at absolute address `addr`.
    pub fn write_at(&self, addr: u64, bytes: &[u8]) -> Result<(), NixlError> {
        let offset = self.offset_of(addr, bytes.len() as u64)?;
        let _guard = self.access.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `offset + bytes.len()` lies within the allocation (checked above), and
        // `bytes` is a Rust slice, so it cannot overlap memory this value owns exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies the bytes at absolute address `addr` into `out`.
    pub fn read_at(&self, addr: u64, out: &mut [u8]) -> Result<(), NixlError> {
        let offset = self.offset_of(addr, out.len() as u64)?;
        let _guard = self.access.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: as in `write_at`; `out` is an exclusive Rust slice, disjoint from the
        // buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// A copy of `len` bytes at absolute address `addr`.
    pub fn to_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, NixlError> {
        let mut out = vec![0; len];
        self.read_at(addr, &mut out)?;
        Ok(out)
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout, and freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl MemoryRegion for HostBuffer {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    fn size(&self) -> usize {
        self.len()
    }
}

impl NixlDescriptor for HostBuffer {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// An open file of a fixed length, for the POSIX backend; offsets into it are the
/// addresses of its blocks (the layout's [`MemoryType::Disk`]).
#[derive(Debug)]
pub struct FileRegion {
    file: File,
    len: u64,
}

impl FileRegion {
    /// Creates (or truncates) the file at `path` and sizes it to `len` bytes.
    pub fn create(path: &Path, len: u64) -> Result<Self, NixlError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len)?;
        Ok(Self { file, len })
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file as a layout region (offsets from 0), for
    /// [`kvtwin::layout::FullyContiguous::new`] and the like.
    pub fn region(&self) -> Region {
        Region {
            memory_type: MemoryType::Disk,
            device_id: 0,
            base_addr: 0,
            len: self.len,
        }
    }

    /// The file descriptor, which NIXL uses as the FILE memory's device id.
    pub(crate) fn fd(&self) -> u64 {
        // Open file descriptors are never negative.
        self.file.as_raw_fd() as u64
    }

    /// Checks that `len` bytes at `offset` lie in the file.
    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<(), NixlError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(NixlError::OutOfBounds {
                addr: offset,
                len,
                base: 0,
                capacity: self.len,
            }),
        }
    }
}

impl MemoryRegion for FileRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        // A FILE registration's "address" is its starting offset.
        std::ptr::null()
    }

    fn size(&self) -> usize {
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }
}

impl NixlDescriptor for FileRegion {
    fn mem_type(&self) -> MemType {
        MemType::File
    }

    fn device_id(&self) -> u64 {
        self.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_bounded() {
        let buffer = HostBuffer::new(10_000).unwrap();
        assert_eq!(buffer.addr() % HostBuffer::ALIGNMENT as u64, 0);
        assert_eq!(
            buffer.to_vec(buffer.addr(), 10_000).unwrap(),
            vec![0; 10_000]
        );
        buffer.write_at(buffer.addr() + 9_998, &[1, 2]).unwrap();
        assert_eq!(buffer.to_vec(buffer.addr() + 9_998, 2).unwrap(), [1, 2]);
        assert!(matches!(
            buffer.write_at(buffer.addr() + 9_999, &[1, 2]),
            Err(NixlError::OutOfBounds { .. })
        ));
        assert!(matches!(
            buffer.read_at(buffer.addr() - 1, &mut [0]),
            Err(NixlError::OutOfBounds { .. })
        ));
        assert!(matches!(
            HostBuffer::new(0),
            Err(NixlError::Alloc { len: 0 })
        ));
    }

    #[test]
    fn file_regions_have_their_length() {
        let dir = tempfile::tempdir().unwrap();
        let file = FileRegion::create(&dir.path().join("blocks"), 8192).unwrap();
        assert_eq!(file.file().metadata().unwrap().len(), 8192);
        assert!(file.check(4096, 4096).is_ok());
        assert!(file.check(4097, 4096).is_err());
        assert_eq!(file.region().memory_type, MemoryType::Disk);
    }
}
