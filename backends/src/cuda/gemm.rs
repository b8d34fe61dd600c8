//! The GEMM benchmark: a forward pass's matrix multiplies, timed on the GPU with cuBLAS,
//! and one device-to-device copy for the HBM bandwidth the GPU reaches. What the
//! simulator's roofline fits from AIConfigurator, measured on the silicon at hand.
//!
//! Owns: [`GemmShapes`] (a model's per-layer projections, Llama-3-8B's by default),
//! [`GemmConfig`], [`run`] and its [`GemmReport`]. For each token count `M` it times, with
//! CUDA events on one stream, every layer's GEMMs (`M × K` activations by `K × N`
//! weights in bf16, fp32 accumulation, cuBLAS's default algorithm) and the LM head: the
//! median of `repeats` forwards after one warm-up. One layer's weights are allocated
//! and reused by every layer; at hundreds of MB they are far larger than the L2 cache,
//! so each layer still reads them from HBM. Attention, norms and sampling are not timed.
//! Never: assert a speed (it reports; BENCHMARKS.md records), or run without a GPU and
//! cuBLAS (it returns [`GemmError`]).

use super::bench::EventTimer;
use super::{driver, CudaDevice, CudaError};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::result;
use cudarc::driver::sys;
use std::ffi::{c_int, c_void};
use std::time::Duration;

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GemmError {
    /// CUDA could not be used.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The cuBLAS library (libcublas) is not installed or cannot be loaded.
    #[error("the cuBLAS library (libcublas) is not present on this machine")]
    CublasMissing,
    /// A cuBLAS call failed.
    #[error("{call}: {status:?}")]
    Cublas {
        /// The call.
        call: &'static str,
        /// cuBLAS's status.
        status: blas_sys::cublasStatus_t,
    },
}

fn cublas(call: &'static str) -> impl FnOnce(blas::CublasError) -> GemmError {
    move |error| GemmError::Cublas {
        call,
        status: error.0,
    }
}

/// One projection: `K` inputs to `N` outputs per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Projection {
    /// Its name (`qkv`, `o`, `gate_up`, `down`, `lm_head`).
    pub name: &'static str,
    /// Input features.
    pub k: usize,
    /// Output features.
    pub n: usize,
}

/// A model's GEMMs: the projections of one layer, the layer count and the LM head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmShapes {
    /// A name for the report.
    pub model: String,
    /// One layer's projections.
    pub layer: Vec<Projection>,
    /// Layers.
    pub layers: usize,
    /// The LM head (once per pass).
    pub head: Projection,
}

impl GemmShapes {
    /// Llama-3-8B: hidden 4,096, 32 query and 8 KV heads of 128, MLP 14,336, vocabulary
    /// 128,256, 32 layers.
    pub fn llama3_8b() -> Self {
        Self {
            model: "llama-3-8b".into(),
            layer: vec![
                Projection {
                    name: "qkv",
                    k: 4096,
                    n: 4096 + 2 * 1024,
                },
                Projection {
                    name: "o",
                    k: 4096,
                    n: 4096,
                },
                Projection {
                    name: "gate_up",
                    k: 4096,
                    n: 2 * 14336,
                },
                Projection {
                    name: "down",
                    k: 14336,
                    n: 4096,
                },
            ],
            layers: 32,
            head: Projection {
                name: "lm_head",
                k: 4096,
                n: 128_256,
            },
        }
    }

    /// Weights multiplied per token: every layer's projections and the head.
    pub fn gemm_params(&self) -> u64 {
        let layer: usize = self.layer.iter().map(|p| p.k * p.n).sum();
        (layer * self.layers + self.head.k * self.head.n) as u64
    }
}

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmConfig {
    /// The GPU.
    pub ordinal: u32,
    /// The model's shapes.
    pub shapes: GemmShapes,
    /// Token counts (the GEMMs' `M`) to time.
    pub tokens: Vec<usize>,
    /// Timed forwards per token count.
    pub repeats: usize,
    /// Bytes of the device-to-device copy.
    pub copy_bytes: usize,
}

impl Default for GemmConfig {
    fn default() -> Self {
        Self {
            ordinal: 0,
            shapes: GemmShapes::llama3_8b(),
            tokens: vec![1, 16, 64, 256, 1024, 4096, 8192],
            repeats: 5,
            copy_bytes: 4 << 30,
        }
    }
}

/// One token count's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmPoint {
    /// Tokens (`M`).
    pub tokens: usize,
    /// The forward's GEMMs, every layer and the head.
    pub time: Duration,
    /// FLOP/s reached: `2 × gemm_params × tokens` over the time.
    pub flops_per_s: f64,
    /// Weight bytes read per second (bf16): `2 × gemm_params` over the time.
    pub weight_bytes_per_s: f64,
}

/// What [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmReport {
    /// The GPU's name.
    pub gpu: String,
    /// The shapes' model.
    pub model: String,
    /// Weights multiplied per token.
    pub gemm_params: u64,
    /// Per token count.
    pub points: Vec<GemmPoint>,
    /// HBM bytes moved per second by one device-to-device copy (read and write counted).
    pub copy_hbm_bytes_per_s: f64,
}

/// Runs the benchmark; see the module documentation.
pub fn run(config: &GemmConfig) -> Result<GemmReport, GemmError> {
    let device = CudaDevice::open(config.ordinal)?;
    // SAFETY: only tries to load the library (cudarc panics at first use otherwise).
    if !unsafe { blas_sys::is_culib_present() } {
        return Err(GemmError::CublasMissing);
    }
    device.bind()?;
    let shapes = &config.shapes;
    let max_tokens = config.tokens.iter().copied().max().unwrap_or(1).max(1);
    let widest = shapes
        .layer
        .iter()
        .chain([&shapes.head])
        .map(|p| p.k.max(p.n))
        .max()
        .unwrap_or(1);
    // bf16: two bytes an element. One layer's weights, the head's, and two activation
    // buffers wide enough for any projection.
    let layer_weights: Vec<Buffer> = shapes
        .layer
        .iter()
        .map(|p| Buffer::new(2 * p.k * p.n))
        .collect::<Result<_, _>>()?;
    let head_weights = Buffer::new(2 * shapes.head.k * shapes.head.n)?;
    let input = Buffer::new(2 * max_tokens * widest)?;
    let output = Buffer::new(2 * max_tokens * widest)?;

    let timer = EventTimer::new(&device)?;
    let handle = Handle::new(timer.stream())?;
    let mut points = Vec::new();
    for &tokens in &config.tokens {
        let tokens = tokens.max(1);
        let time = timer.median::<GemmError>(config.repeats.max(1), |_| {
            for _ in 0..shapes.layers {
                for (projection, weights) in shapes.layer.iter().zip(&layer_weights) {
                    handle.gemm(tokens, projection, weights, &input, &output)?;
                }
            }
            handle.gemm(tokens, &shapes.head, &head_weights, &input, &output)
        })?;
        let params = shapes.gemm_params() as f64;
        points.push(GemmPoint {
            tokens,
            time,
            flops_per_s: 2.0 * params * tokens as f64 / time.as_secs_f64(),
            weight_bytes_per_s: 2.0 * params / time.as_secs_f64(),
        });
    }
    drop(handle);
    drop((input, output, head_weights, layer_weights));

    let source = Buffer::new(config.copy_bytes)?;
    let target = Buffer::new(config.copy_bytes)?;
    let copy = timer.median::<GemmError>(config.repeats.max(1), |stream| {
        // SAFETY: both buffers are `copy_bytes` long and used by nothing else; the
        // stream is waited for before they are freed.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(target.0, source.0, config.copy_bytes, stream)
                .result()
                .map_err(driver("cuMemcpyDtoDAsync"))?;
        }
        Ok(())
    })?;
    Ok(GemmReport {
        gpu: device.name().to_string(),
        model: shapes.model.clone(),
        gemm_params: shapes.gemm_params(),
        points,
        copy_hbm_bytes_per_s: 2.0 * config.copy_bytes as f64 / copy.as_secs_f64(),
    })
}

/// Device memory, freed on drop (contents never read: timing only).
struct Buffer(sys::CUdeviceptr);

impl Buffer {
    fn new(bytes: usize) -> Result<Self, CudaError> {
        // SAFETY: a plain allocation in the current context (bound by the caller).
        let pointer = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(driver("cuMemAlloc"))?;
        // Zeros: bf16 zeros are ordinary numbers, so no GEMM meets NaNs or denormals.
        // SAFETY: `bytes` of the allocation just made.
        unsafe { result::memset_d8_sync(pointer, 0, bytes.max(1)) }
            .map_err(driver("cuMemsetD8"))?;
        Ok(Self(pointer))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once; every use was waited for.
        let _ = unsafe { result::free_sync(self.0) };
    }
}

/// A cuBLAS handle on one stream.
struct Handle(blas_sys::cublasHandle_t);

impl Handle {
    fn new(stream: sys::CUstream) -> Result<Self, GemmError> {
        let handle = blas::create_handle().map_err(cublas("cublasCreate"))?;
        // SAFETY: a handle just made, a stream that outlives it (dropped after it).
        unsafe { blas::set_stream(handle, stream.cast()) }.map_err(cublas("cublasSetStream"))?;
        Ok(Self(handle))
    }

    /// `output (M × N) = input (M × K) · weights (K × N)`, bf16 in and out, fp32
    /// accumulation. cuBLAS is column-major: as `output^T (N × M) = weights^T (N × K) ·
    /// input^T (K × M)` with the row-major buffers read as their transposes.
    fn gemm(
        &self,
        tokens: usize,
        projection: &Projection,
        weights: &Buffer,
        input: &Buffer,
        output: &Buffer,
    ) -> Result<(), GemmError> {
        let (m, n, k) = (
            tokens as c_int,
            projection.n as c_int,
            projection.k as c_int,
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        let bf16 = blas_sys::cudaDataType::CUDA_R_16BF;
        // SAFETY: the buffers hold at least N × K, M × K and M × N bf16 elements (sized
        // in `run` from the largest projection and token count); the scalars live
        // across the call, which only enqueues.
        unsafe {
            blas::gemm_ex(
                self.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                weights.0 as *const c_void,
                bf16,
                n,
                input.0 as *const c_void,
                bf16,
                k,
                (&beta as *const f32).cast::<c_void>(),
                output.0 as *mut c_void,
                bf16,
                n,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cublas("cublasGemmEx"))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, its stream idle.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_8b_multiplies_its_weights_but_the_embedding() {
        // 32 × (4096 × 6144 + 4096² + 4096 × 28672 + 14336 × 4096) + 4096 × 128256:
        // 7.50e9 of the model's 8.03e9 parameters (the embedding is a lookup).
        let params = GemmShapes::llama3_8b().gemm_params();
        assert_eq!(params, 32 * 218_103_808 + 525_336_576);
        assert!((7.4e9..7.6e9).contains(&(params as f64)));
    }

    #[test]
    fn without_a_gpu_it_says_so() {
        if let Err(error) = run(&GemmConfig::default()) {
            let message = error.to_string();
            assert!(
                message.contains("CUDA") || message.contains("GPU") || message.contains("cuBLAS"),
                "{message}"
            );
        }
    }
}
