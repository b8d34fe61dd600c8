//! CUDA for the real backend (feature `cuda`): the GPU as the device tier, pinned host
//! memory as the host tier, block copies batched on streams and completed by CUDA events.
//!
//! Owns: [`CudaDevice`] (one GPU's primary context, opened only after checking that the
//! driver library is present and the GPU exists, so a machine without either gets a
//! [`CudaError`], never a panic), [`CudaError`], the device-memory arena and the pinned
//! host region (module `memory`), the per-worker copy stream (module `stream`), the
//! block-copy benchmark (module [`bench`]) and the GEMM benchmark (module [`gemm`],
//! cuBLAS). The host backend reaches the GPU only through
//! its own `host::device` traits, which `memory` and `stream` implement (`open_gpu` is
//! the one entry point it calls), so the dependency runs one way: `cuda` → `host`.
//!
//! cudarc is used at its `result` layer (thin, checked wrappers over the driver API)
//! rather than its safe layer: the arenas address blocks at raw offsets inside one
//! allocation, and every copy is fenced by an event the worker waits on before it lets go
//! of the blocks it borrowed, which is the one invariant the `unsafe` here relies on.
//! The driver is loaded at run time (`dynamic-loading`), so the feature builds on any
//! machine; only running it needs a GPU.
//! Never: call into the driver before [`CudaDevice::open`] has checked the library is
//! there (cudarc panics if it is not), or let a copy outlive the borrow of its host bytes.

pub mod bench;
pub mod gemm;
pub(crate) mod memory;
pub(crate) mod stream;

use cudarc::driver::{result, sys, DriverError};
use std::ffi::c_int;
use std::sync::Arc;

/// CUDA could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The CUDA driver library (libcuda) is not installed or cannot be loaded.
    #[error("the CUDA driver library (libcuda) is not present on this machine")]
    DriverMissing,
    /// The driver is present but sees no GPU.
    #[error("the CUDA driver sees no GPU")]
    NoDevice,
    /// The GPU asked for does not exist.
    #[error("no GPU {ordinal}: the driver sees {count}")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// GPUs the driver sees.
        count: u32,
    },
    /// A driver call failed.
    #[error("{call}: {source}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// A size does not fit the address space.
    #[error("{what}: {bytes} bytes do not fit")]
    TooLarge {
        /// What was being sized.
        what: &'static str,
        /// Bytes asked for.
        bytes: u128,
    },
}

/// The error of driver call `call`.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |source| CudaError::Driver { call, source }
}

/// One GPU, through its primary context (the one the CUDA runtime and other libraries in
/// the process share).
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: u32,
    device: sys::CUdevice,
    context: sys::CUcontext,
    name: String,
    total_memory: usize,
}

// SAFETY: `CUcontext` is a handle; the driver API is thread safe and every thread that
// uses the context makes it current first (`bind`).
unsafe impl Send for CudaDevice {}
// SAFETY: as above; `CudaDevice` has no interior state of its own.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Opens GPU `ordinal`: checks that the driver library loads, initialises the driver,
    /// checks the GPU exists and retains its primary context.
    pub fn open(ordinal: u32) -> Result<Arc<Self>, CudaError> {
        // SAFETY: only tries to load the library; cudarc's every other entry point
        // panics when it is missing, which is why this comes first.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::DriverMissing);
        }
        match result::init() {
            Ok(()) => {}
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_NO_DEVICE)) => {
                return Err(CudaError::NoDevice)
            }
            Err(source) => {
                return Err(CudaError::Driver {
                    call: "cuInit",
                    source,
                })
            }
        }
        let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        let count = u32::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(CudaError::NoDevice);
        }
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let device = result::device::get(ordinal as c_int).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `device` came from the driver just above.
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // From here on `opened` owns the retained context: an error below drops it, which
        // releases the context once. It is filled in place and moved into the Arc, never
        // rebuilt with `..opened` (that copies the handles and then drops `opened`,
        // releasing the context the new value still uses: the driver destroys it and the
        // first allocation fails with CUDA_ERROR_CONTEXT_IS_DESTROYED).
        let mut opened = Self {
            ordinal,
            device,
            context,
            name: String::new(),
            total_memory: 0,
        };
        opened.bind()?;
        opened.name = result::device::get_name(device).map_err(driver("cuDeviceGetName"))?;
        // SAFETY: as above.
        opened.total_memory =
            unsafe { result::device::total_mem(device) }.map_err(driver("cuDeviceTotalMem"))?;
        Ok(Arc::new(opened))
    }

    /// Makes this GPU's context current on the calling thread; every thread does so before
    /// its first driver call on this GPU.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx::set_current(self.context) }.map_err(driver("cuCtxSetCurrent"))
    }

    /// The ordinal it was opened with.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The GPU's name, as the driver reports it (e.g. "NVIDIA H100 80GB HBM3").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GPU's memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.total_memory
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // SAFETY: retained once in `open`, released once here. A failure leaves the
        // context to the process's end; there is nothing better to do in a destructor.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// Opens GPU `ordinal` as the host backend's [`Gpu`](crate::host::device::Gpu): where
/// `HostHardware` gets its device tier and pinned host tier, without naming a CUDA type.
pub(crate) fn open_gpu(ordinal: u32) -> Result<Box<dyn crate::host::device::Gpu>, CudaError> {
    Ok(Box::new(CudaDevice::open(ordinal)?))
}

/// The bytes of `count` blocks of `block_bytes`, or an error naming `what`.
pub(crate) fn region_bytes(
    what: &'static str,
    count: usize,
    block_bytes: usize,
) -> Result<usize, CudaError> {
    count.checked_mul(block_bytes).ok_or(CudaError::TooLarge {
        what,
        bytes: count as u128 * block_bytes as u128,
    })
}
