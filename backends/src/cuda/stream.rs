//! A worker's CUDA stream and the batches of block copies it runs.
//!
//! Owns: [`CopyStream`] (a non-blocking stream and a completion event, made on the
//! worker thread that uses them) and [`Batch`], the copies of one transfer: every block
//! is enqueued on the stream, one event is recorded after the last, and the worker
//! sleeps on that event (blocking sync, not a spin: two cores are shared with the
//! workers that do disk I/O). Enqueueing a whole transfer before waiting is what lets
//! many small copies keep the link busy; waiting on one event per transfer is what the
//! manager's completion path needs. [`CopyStream`] is the host backend's `CopyEngine`:
//! `host` hands it a transfer's copies without naming it.
//! Never: return while a copy it enqueued may still touch host memory: [`CopyStream::batch`]
//! waits for the event even when enqueueing failed half way.

use super::{driver, CudaDevice, CudaError};
use crate::host::device::{BlockCopy, CopyEngine};
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys;
use kvtwin::hardware::TransferError;
use kvtwin::tier::Tier;
use std::marker::PhantomData;
use std::sync::Arc;

/// A stream and its completion event on one GPU, for one thread.
#[derive(Debug)]
pub(crate) struct CopyStream {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
    done: sys::CUevent,
}

// SAFETY: the handles are used only by the thread that owns the `CopyStream`; moving it
// between threads is allowed by the driver (a stream is not bound to a thread).
unsafe impl Send for CopyStream {}

impl CopyStream {
    /// A stream and an event on `device`, which becomes current on this thread.
    pub(crate) fn new(device: &Arc<CudaDevice>) -> Result<Self, CudaError> {
        device.bind()?;
        let stream =
            result::stream::create(StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?;
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC;
        let done = match result::event::create(flags) {
            Ok(event) => event,
            Err(source) => {
                // SAFETY: created just above, not used since.
                let _ = unsafe { result::stream::destroy(stream) };
                return Err(CudaError::Driver {
                    call: "cuEventCreate",
                    source,
                });
            }
        };
        Ok(Self {
            device: device.clone(),
            stream,
            done,
        })
    }

    /// Runs `enqueue` (which adds copies to the batch), then waits until every copy it
    /// added has finished. The host slices given to the batch are borrowed for `'h`,
    /// which outlives this call: no copy can touch them once it returns.
    pub(crate) fn batch<'h, R>(
        &mut self,
        enqueue: impl FnOnce(&mut Batch<'h>) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        self.device.bind()?;
        let mut batch = Batch {
            stream: self.stream,
            _host: PhantomData,
        };
        let enqueued = enqueue(&mut batch);
        // Wait even if enqueueing failed: earlier copies of the batch may be running.
        let waited = self.wait();
        let value = enqueued?;
        waited.map(|()| value)
    }

    fn wait(&self) -> Result<(), CudaError> {
        // SAFETY: both handles live as long as `self`.
        let recorded = unsafe { result::event::record(self.done, self.stream) };
        let synced = match recorded {
            // SAFETY: as above.
            Ok(()) => unsafe { result::event::synchronize(self.done) }
                .map_err(driver("cuEventSynchronize")),
            Err(source) => Err(CudaError::Driver {
                call: "cuEventRecord",
                source,
            }),
        };
        if synced.is_err() {
            // The event could not fence the batch: drain the stream itself, so the host
            // memory it reads or writes is free when we return.
            // SAFETY: as above.
            let _ = unsafe { result::stream::synchronize(self.stream) };
        }
        synced
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once here; `batch` left nothing running.
            unsafe {
                let _ = result::event::destroy(self.done);
                let _ = result::stream::destroy(self.stream);
            }
        }
    }
}

impl CopyEngine for CopyStream {
    unsafe fn run(&mut self, copies: Vec<BlockCopy<'_>>) -> Result<(), TransferError> {
        self.batch(|batch| {
            for copy in copies {
                // SAFETY: the caller's promise (see `CopyEngine::run`) is the one each
                // enqueue asks for: the device memory is live and locked for the batch.
                unsafe {
                    match copy {
                        BlockCopy::HostToDevice { dst, src } => batch.host_to_device(dst, src)?,
                        BlockCopy::DeviceToHost { dst, src } => batch.device_to_host(dst, src)?,
                        BlockCopy::DeviceToDevice { dst, src, len } => {
                            batch.device_to_device(dst, src, len)?
                        }
                    }
                }
            }
            Ok(())
        })
        .map_err(|_| TransferError::Failed { tier: Tier::Device })
    }
}

/// The copies of one batch; see [`CopyStream::batch`].
#[derive(Debug)]
pub(crate) struct Batch<'h> {
    stream: sys::CUstream,
    _host: PhantomData<&'h mut [u8]>,
}

impl<'h> Batch<'h> {
    /// Host to device: `src` to the `src.len()` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must address `src.len()` bytes of live device memory that nothing else
    /// touches until the batch ends (the caller holds the block's write lock).
    pub(crate) unsafe fn host_to_device(
        &mut self,
        dst: sys::CUdeviceptr,
        src: &'h [u8],
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's promise for `dst`; `src` is borrowed past the batch's end.
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Device to host: the `dst.len()` bytes at `src` to `dst`.
    ///
    /// # Safety
    /// `src` must address `dst.len()` bytes of live device memory that nothing writes
    /// until the batch ends (the caller holds the block's read lock).
    pub(crate) unsafe fn device_to_host(
        &mut self,
        dst: &'h mut [u8],
        src: sys::CUdeviceptr,
    ) -> Result<(), CudaError> {
        // SAFETY: as above.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }
            .map_err(driver("cuMemcpyDtoHAsync"))
    }

    /// Device to device: `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both must address `len` bytes of live device memory, `dst` held exclusively and
    /// `src` unwritten until the batch ends.
    pub(crate) unsafe fn device_to_device(
        &mut self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        len: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: as above.
        unsafe { result::memcpy_dtod_async(dst, src, len, self.stream) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }
}
