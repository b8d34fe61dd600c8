//! The disk tier: one extent file holding every block, each with its BLAKE3.
//!
//! Owns: [`DiskExtent`] (the file, created under the configured directory and removed
//! when the hardware is dropped; or, kept, [`KEPT_FILE`] there, reopened by the next
//! process and locked while open), [`AlignedBuf`] (the staging buffers direct I/O needs),
//! [`DiskIo`] / [`DiskIoMode`] (what was asked for, what the filesystem gave), and
//! [`DiskStorage`], the raw [`Storage`] view of the same file.
//!
//! File format: block `id` occupies `stride` bytes at offset `id × stride`, where
//! `stride = align_up(block_bytes + TRAILER_LEN, 4096)`. A slot is the block's bytes, then
//! a trailer: the magic `KVTWBLK1`, the block length (`u64` LE), and the 32-byte BLAKE3 of
//! `le_u32(id) ++ bytes` (the id is hashed too, so a block written to the wrong slot does
//! not verify), then zero padding. A slot never written reads as corrupt.
//!
//! Direct I/O: asked for with `O_DIRECT` (Linux), with buffers, offsets and lengths
//! aligned to [`DIRECT_IO_ALIGN`]. A filesystem that refuses it (at `open` or at the first
//! aligned read or write, `EINVAL` / `EOPNOTSUPP`) gets the same file opened buffered; the
//! mode in use is recorded and reported. Blocks are not synced one by one: the disk tier
//! is a cache, so losing it in a crash loses nothing the manager counts on
//! ([`DiskStorage::sync_data`] syncs when a caller wants durability). A kept file
//! outlives a process, killed or not (the page cache writes it out); after a power loss
//! a slot whose write did not land fails its checksum, and reads as corrupt.
//! Never: serve bytes whose checksum failed (reads return [`ReadError::Corrupt`] and leave
//! the caller's destination alone), or use `unsafe` (alignment comes from over-allocating).

use super::HostError;
use kvtwin::hardware::{Storage, StorageError};
use kvtwin::ids::BlockId;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Alignment of buffers, offsets and lengths for direct I/O: the largest logical block
/// size in common use.
pub const DIRECT_IO_ALIGN: usize = 4096;
/// Bytes of the per-block trailer: magic, length, BLAKE3.
pub const TRAILER_LEN: usize = 8 + 8 + 32;
const MAGIC: [u8; 8] = *b"KVTWBLK1";
/// The name of a kept extent file in its directory.
pub const KEPT_FILE: &str = "kvtwin-disk.extent";

/// How the disk tier should open its file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiskIo {
    /// Direct I/O where the filesystem allows it, buffered otherwise.
    #[default]
    Auto,
    /// Always through the page cache.
    Buffered,
}

/// How the disk tier's file is actually read and written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskIoMode {
    /// `O_DIRECT`: around the page cache.
    Direct,
    /// Through the page cache (asked for, or the filesystem refused direct I/O).
    Buffered,
}

/// A buffer whose usable part starts at a multiple of [`DIRECT_IO_ALIGN`], obtained by
/// over-allocating and skipping to the first aligned byte (no `unsafe` allocation).
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes, aligned; `None` when the allocation is refused.
    pub(crate) fn new(len: usize) -> Option<Self> {
        let total = len.checked_add(DIRECT_IO_ALIGN)?;
        let mut raw = Vec::new();
        raw.try_reserve_exact(total).ok()?;
        raw.resize(total, 0);
        // The vector never grows again, so its data (and this offset) never moves.
        let start = raw.as_ptr().align_offset(DIRECT_IO_ALIGN);
        (start <= DIRECT_IO_ALIGN).then_some(Self { raw, start, len })
    }

    /// The aligned bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The aligned bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// A disk read that did not produce the block.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The file could not be read.
    Io,
    /// The bytes read do not match their checksum (or the slot was never written).
    Corrupt,
}

/// The disk tier's extent file.
#[derive(Debug)]
pub(crate) struct DiskExtent {
    file: File,
    path: PathBuf,
    /// Kept when dropped (and opened again by the next process).
    kept: bool,
    /// A kept file of the same size was there: its slots hold what they held.
    reopened: bool,
    mode: DiskIoMode,
    block_bytes: usize,
    stride: usize,
    capacity: usize,
}

/// Makes extent names unique within the process (the pid makes them unique across).
static NEXT_EXTENT: AtomicU64 = AtomicU64::new(0);

/// Opens `path` for direct I/O: creating it, when `fresh` (it must not exist), or
/// opening it, created if absent.
fn open_direct(path: &Path, fresh: bool) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if fresh {
            options.create_new(true);
        } else {
            options.create(true);
        }
        options.custom_flags(libc::O_DIRECT).open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (path, fresh);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Whether `error` is a filesystem's way of refusing direct I/O.
fn refuses_direct(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::Unsupported
        || matches!(
            error.raw_os_error(),
            Some(code) if code == libc::EINVAL || code == libc::EOPNOTSUPP
        )
}

impl DiskExtent {
    /// Bytes of one block's slot in the file.
    pub(crate) fn stride_for(block_bytes: usize) -> Option<usize> {
        block_bytes
            .checked_add(TRAILER_LEN)?
            .checked_next_multiple_of(DIRECT_IO_ALIGN)
    }

    /// A new extent file for `capacity` blocks in `dir` (which must exist); with `keep`,
    /// [`KEPT_FILE`] there, reopened as it is when it has this size, kept when dropped,
    /// and locked against other processes while open.
    pub(crate) fn create(
        dir: &Path,
        capacity: usize,
        block_bytes: usize,
        io: DiskIo,
        keep: bool,
    ) -> Result<Self, HostError> {
        Self::create_with(dir, capacity, block_bytes, io, keep, open_direct)
    }

    /// [`DiskExtent::create`] with the direct-I/O `open` given, so tests can play a
    /// filesystem that refuses it.
    pub(crate) fn create_with(
        dir: &Path,
        capacity: usize,
        block_bytes: usize,
        io: DiskIo,
        keep: bool,
        open_direct: fn(&Path, bool) -> io::Result<File>,
    ) -> Result<Self, HostError> {
        let bad_dir = |source| HostError::DiskDirectory {
            path: dir.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(dir).map_err(bad_dir)?;
        if !meta.is_dir() {
            return Err(bad_dir(io::Error::from(io::ErrorKind::NotADirectory)));
        }
        let too_large = HostError::TooLarge {
            tier: kvtwin::tier::Tier::Disk,
        };
        let stride = Self::stride_for(block_bytes).ok_or(too_large)?;
        let file_len = (capacity as u64)
            .checked_mul(stride as u64)
            .ok_or(HostError::TooLarge {
                tier: kvtwin::tier::Tier::Disk,
            })?;
        let (path, direct) = if keep {
            let path = dir.join(KEPT_FILE);
            let attempt = match io {
                DiskIo::Auto => open_direct(&path, false),
                DiskIo::Buffered => Err(io::Error::from(io::ErrorKind::Unsupported)),
            };
            (path, attempt)
        } else {
            Self::new_file(dir, io, open_direct)?
        };
        let file_error = |source| HostError::DiskFile {
            path: path.clone(),
            source,
        };
        let (mut file, mut mode) = match direct {
            Ok(file) => (file, DiskIoMode::Direct),
            Err(error) if refuses_direct(&error) || io == DiskIo::Buffered => (
                Self::open_buffered(&path, keep).map_err(file_error)?,
                DiskIoMode::Buffered,
            ),
            Err(error) => return Err(file_error(error)),
        };
        if mode == DiskIoMode::Direct && capacity > 0 {
            // Some filesystems take O_DIRECT at open and refuse the I/O itself: try one
            // aligned read and write of slot 0, writing back what it holds.
            let mut probe = AlignedBuf::new(stride).ok_or(HostError::OutOfMemory {
                tier: kvtwin::tier::Tier::Disk,
                bytes: stride as u64,
            })?;
            let len = file.metadata().map_err(file_error)?.len();
            let tried = if len >= stride as u64 {
                file.read_exact_at(probe.as_mut_slice(), 0)
                    .and_then(|()| file.write_all_at(probe.as_slice(), 0))
            } else {
                file.set_len(stride as u64)
                    .and_then(|()| file.write_all_at(probe.as_slice(), 0))
                    .and_then(|()| file.read_exact_at(probe.as_mut_slice(), 0))
            };
            match tried {
                Ok(()) => {}
                Err(error) if refuses_direct(&error) => {
                    file = Self::open_buffered(&path, true).map_err(file_error)?;
                    mode = DiskIoMode::Buffered;
                }
                Err(error) => return Err(file_error(error)),
            }
        }
        if keep {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(HostError::DiskInUse { path });
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(file_error(error)),
            }
        }
        // A kept file of another size was another tier's: it starts over, empty.
        let reopened =
            keep && capacity > 0 && file.metadata().map_err(file_error)?.len() == file_len;
        if !reopened {
            file.set_len(0)
                .and_then(|()| file.set_len(file_len))
                .map_err(file_error)?;
        }
        Ok(Self {
            file,
            path,
            kept: keep,
            reopened,
            mode,
            block_bytes,
            stride,
            capacity,
        })
    }

    /// Picks a fresh name in `dir` and creates it, with direct I/O unless `io` says
    /// otherwise. Returns the path and the direct-I/O attempt's outcome (an error that
    /// refuses direct I/O means: open it buffered).
    fn new_file(
        dir: &Path,
        io: DiskIo,
        open_direct: fn(&Path, bool) -> io::Result<File>,
    ) -> Result<(PathBuf, io::Result<File>), HostError> {
        // A stale file of a dead process with our pid may hold a name: try the next.
        for _ in 0..64 {
            let n = NEXT_EXTENT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("kvtwin-disk-{}-{n}.extent", std::process::id()));
            let attempt = match io {
                DiskIo::Auto => open_direct(&path, true),
                DiskIo::Buffered => Err(io::Error::from(io::ErrorKind::Unsupported)),
            };
            match attempt {
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) if !refuses_direct(&error) => {
                    return Err(HostError::DiskDirectory {
                        path: dir.to_path_buf(),
                        source: error,
                    })
                }
                attempt => return Ok((path, attempt)),
            }
        }
        Err(HostError::DiskDirectory {
            path: dir.to_path_buf(),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }

    /// Opens `path` buffered, created if absent; emptied unless `keep` (a kept file
    /// is emptied, if at all, once it is locked).
    fn open_buffered(path: &Path, keep: bool) -> io::Result<File> {
        // The refused direct open may or may not have created the file already.
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!keep)
            .open(path)
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a kept file of this size was found and opened as it was.
    pub(crate) fn reopened(&self) -> bool {
        self.reopened
    }

    /// Direct or buffered.
    pub(crate) fn mode(&self) -> DiskIoMode {
        self.mode
    }

    /// Bytes of one slot.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Blocks the file holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn offset(&self, block: BlockId) -> Option<u64> {
        (block.index() < self.capacity).then(|| block.index() as u64 * self.stride as u64)
    }

    /// Writes block `block` from `slot` (one stride; its first `block_bytes` hold the
    /// block), adding the trailer in place.
    pub(crate) fn write_block(&self, block: BlockId, slot: &mut AlignedBuf) -> io::Result<()> {
        let offset = self
            .offset(block)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let bytes = slot.as_mut_slice();
        let (data, rest) = bytes.split_at_mut(self.block_bytes);
        let hash = checksum(block, data);
        rest[..8].copy_from_slice(&MAGIC);
        rest[8..16].copy_from_slice(&(self.block_bytes as u64).to_le_bytes());
        rest[16..TRAILER_LEN].copy_from_slice(hash.as_bytes());
        rest[TRAILER_LEN..].fill(0);
        self.file
            .write_all_at(&slot.as_slice()[..self.stride], offset)
    }

    /// Reads block `block` into `slot` (one stride) and verifies it: on success the
    /// first `block_bytes` of `slot` hold the block.
    pub(crate) fn read_block(
        &self,
        block: BlockId,
        slot: &mut AlignedBuf,
    ) -> Result<(), ReadError> {
        let offset = self.offset(block).ok_or(ReadError::Io)?;
        let bytes = &mut slot.as_mut_slice()[..self.stride];
        self.file
            .read_exact_at(bytes, offset)
            .map_err(|_| ReadError::Io)?;
        let (data, trailer) = bytes.split_at(self.block_bytes);
        let intact = trailer[..8] == MAGIC
            && trailer[8..16] == (self.block_bytes as u64).to_le_bytes()
            && trailer[16..TRAILER_LEN] == *checksum(block, data).as_bytes();
        if intact {
            Ok(())
        } else {
            Err(ReadError::Corrupt)
        }
    }

    /// A buffered handle on the same file, for [`DiskStorage`].
    pub(crate) fn raw_handle(&self) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(&self.path)
    }
}

impl Drop for DiskExtent {
    fn drop(&mut self) {
        if self.kept {
            // What the slots hold is for the next process; the page cache writes it out.
            return;
        }
        // The tier is a cache that starts empty: its file goes with it. A failure leaves
        // a stale file behind, which a later run never opens (names are fresh).
        let _ = std::fs::remove_file(&self.path);
    }
}

fn checksum(block: BlockId, data: &[u8]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&block.get().to_le_bytes());
    hasher.update(data);
    hasher.finalize()
}

/// The disk tier's file as raw bytes (slots and trailers as laid out above), through a
/// buffered handle of its own: what [`kvtwin::hardware::Hardware::storage`] returns. With
/// no disk tier it is empty and every access is out of range.
#[derive(Debug)]
pub struct DiskStorage {
    file: Option<File>,
}

impl DiskStorage {
    pub(crate) fn new(file: Option<File>) -> Self {
        Self { file }
    }

    fn check(&self, offset: u64, len: usize) -> Result<&File, StorageError> {
        let size = self.len()?;
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= size);
        match &self.file {
            Some(file) if fits => Ok(file),
            _ => Err(StorageError::OutOfRange {
                offset,
                len: len as u64,
                size,
            }),
        }
    }
}

impl Storage for DiskStorage {
    fn len(&self) -> Result<u64, StorageError> {
        match &self.file {
            Some(file) => Ok(file.metadata()?.len()),
            None => Ok(0),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        Ok(self.check(offset, buf.len())?.read_exact_at(buf, offset)?)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        Ok(self.check(offset, data.len())?.write_all_at(data, offset)?)
    }

    fn set_len(&mut self, len: u64) -> Result<(), StorageError> {
        match &self.file {
            Some(file) => Ok(file.set_len(len)?),
            None => Err(StorageError::OutOfRange {
                offset: 0,
                len,
                size: 0,
            }),
        }
    }

    fn sync_data(&mut self) -> Result<(), StorageError> {
        match &self.file {
            Some(file) => Ok(file.sync_data()?),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse(_: &Path, _: bool) -> io::Result<File> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn round_trip(extent: &DiskExtent) {
        let mut slot = AlignedBuf::new(extent.stride()).unwrap();
        slot.as_mut_slice()[..100].copy_from_slice(&[7u8; 100]);
        extent.write_block(BlockId::new(2), &mut slot).unwrap();
        let mut back = AlignedBuf::new(extent.stride()).unwrap();
        extent.read_block(BlockId::new(2), &mut back).unwrap();
        assert_eq!(back.as_slice()[..100], [7u8; 100]);
        assert!(matches!(
            extent.read_block(BlockId::new(1), &mut back),
            Err(ReadError::Corrupt)
        ));
        assert!(matches!(
            extent.read_block(BlockId::new(4), &mut back),
            Err(ReadError::Io)
        ));
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [1, 4096, 10_000] {
            let buf = AlignedBuf::new(len).unwrap();
            assert_eq!(buf.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
            assert_eq!(buf.as_slice().len(), len);
        }
    }

    #[test]
    fn a_filesystem_refusing_direct_io_gets_buffered_io() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let extent =
            DiskExtent::create_with(dir.path(), 4, 100, DiskIo::Auto, false, refuse).unwrap();
        assert_eq!(extent.mode(), DiskIoMode::Buffered);
        assert_eq!(extent.stride(), 4096);
        round_trip(&extent);
        let path = extent.path().to_path_buf();
        assert!(path.exists());
        drop(extent);
        assert!(!path.exists(), "the extent file goes with the tier");
    }

    #[test]
    fn direct_io_is_used_where_the_filesystem_allows_it() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let extent = DiskExtent::create(dir.path(), 4, 100, DiskIo::Auto, false).unwrap();
        // Which one depends on the filesystem of the temp dir; both must work.
        println!("{}: {:?}", dir.path().display(), extent.mode());
        round_trip(&extent);
        let buffered = DiskExtent::create(dir.path(), 4, 100, DiskIo::Buffered, false).unwrap();
        assert_eq!(buffered.mode(), DiskIoMode::Buffered);
        round_trip(&buffered);
    }

    #[test]
    fn tmpfs_works_with_or_without_direct_io() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            println!("skipped: no /dev/shm (tmpfs) on this machine");
            return;
        }
        let dir = tempfile::tempdir_in(shm).unwrap();
        let extent = DiskExtent::create(dir.path(), 4, 5000, DiskIo::Auto, false).unwrap();
        // tmpfs refuses O_DIRECT before Linux 6.6 and takes it since.
        println!("tmpfs: {:?}", extent.mode());
        assert_eq!(extent.stride(), 8192);
        round_trip(&extent);
    }

    #[test]
    fn a_missing_or_non_directory_path_is_an_error() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            DiskExtent::create(&missing, 4, 100, DiskIo::Auto, false),
            Err(HostError::DiskDirectory { .. })
        ));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            DiskExtent::create(&file, 4, 100, DiskIo::Auto, false),
            Err(HostError::DiskDirectory { .. })
        ));
    }

    #[test]
    fn a_kept_file_outlives_its_tier_is_locked_while_open_and_starts_over_at_another_size() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        for (io, open) in [
            (
                DiskIo::Auto,
                open_direct as fn(&Path, bool) -> io::Result<File>,
            ),
            (DiskIo::Auto, refuse),
            (DiskIo::Buffered, open_direct),
        ] {
            let extent = DiskExtent::create_with(dir.path(), 4, 100, io, true, open).unwrap();
            assert!(!extent.reopened());
            assert_eq!(extent.path(), dir.path().join(KEPT_FILE));
            round_trip(&extent);
            assert!(matches!(
                DiskExtent::create(dir.path(), 4, 100, DiskIo::Auto, true),
                Err(HostError::DiskInUse { .. })
            ));
            drop(extent);
            // Reopened: block 2 is still there (and block 1 still never written).
            let again = DiskExtent::create_with(dir.path(), 4, 100, io, true, open).unwrap();
            assert!(again.reopened(), "{io:?}");
            let mut back = AlignedBuf::new(again.stride()).unwrap();
            again.read_block(BlockId::new(2), &mut back).unwrap();
            assert_eq!(back.as_slice()[..100], [7u8; 100]);
            drop(again);
            // Another geometry: the file is another tier's, and starts empty.
            let other = DiskExtent::create(dir.path(), 5, 100, DiskIo::Auto, true).unwrap();
            assert!(!other.reopened());
            assert!(matches!(
                other.read_block(BlockId::new(2), &mut back),
                Err(ReadError::Corrupt)
            ));
            drop(other);
            std::fs::remove_file(dir.path().join(KEPT_FILE)).unwrap();
        }
    }
}
