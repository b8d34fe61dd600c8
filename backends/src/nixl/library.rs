//! Loading the NIXL C API before `nixl-sys` looks for it.
//!
//! Owns: the process-wide record of whether `libnixl_capi.so` is loaded, and from where.
//! `nixl-sys` with `stub-api` resolves every call through `dlopen("libnixl_capi.so")` on
//! first use and aborts the process when that fails. Loading the library here first, by
//! explicit path, makes the stubs' later lookup by name find it (the loader matches the
//! library's SONAME), and checking `nixl_sys::is_stub()` then confirms it without risk:
//! that one call never aborts.
//! Never: call any other `nixl-sys` function, unload the library (the stubs keep its
//! symbols for the life of the process), or look anywhere the caller did not name.

use super::NixlError;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The environment variable naming the folder that holds [`CAPI_LIBRARY`] (the wheel's
/// `.nixl_cu12.mesonpy.libs/`, as `scripts/setup-nixl.sh` prints it).
pub const LIB_DIR_ENV: &str = "KVTWIN_NIXL_LIB_DIR";

/// The file name `nixl-sys`'s stubs look the C API up by.
pub const CAPI_LIBRARY: &str = "libnixl_capi.so";

/// What this process has loaded.
#[derive(Debug)]
enum State {
    NotLoaded,
    Loaded(PathBuf),
    /// Loaded, but the stubs did not resolve to it; final, since they remember their
    /// first lookup.
    Stub(PathBuf),
}

static STATE: Mutex<State> = Mutex::new(State::NotLoaded);

/// Proof that the real NIXL C API is loaded: every agent constructor takes one, so no
/// `nixl-sys` call can run before the library is there.
#[derive(Clone, Debug)]
pub struct NixlLibrary {
    path: PathBuf,
}

impl NixlLibrary {
    /// Loads [`CAPI_LIBRARY`] from `dir` (its dependencies are found through the
    /// library's own run path) and checks that `nixl-sys` now uses it. Once a load has
    /// succeeded, later calls return that library whatever `dir` they name. A failed
    /// load may be retried, except [`NixlError::Stub`], which is final.
    pub fn load(dir: &Path) -> Result<Self, NixlError> {
        let path = dir.join(CAPI_LIBRARY);
        // A poisoned lock only means another thread panicked mid-load; the state it left
        // is still one of the three.
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        match &*state {
            State::Loaded(loaded) => {
                return Ok(Self {
                    path: loaded.clone(),
                })
            }
            State::Stub(loaded) => {
                return Err(NixlError::Stub {
                    path: loaded.clone(),
                })
            }
            State::NotLoaded => {}
        }
        if !path.is_file() {
            return Err(NixlError::LibraryMissing { path });
        }
        open(&path)?;
        // The stubs' own dlopen by name runs now, and finds the library loaded above.
        if nixl_sys::is_stub() {
            *state = State::Stub(path.clone());
            return Err(NixlError::Stub { path });
        }
        *state = State::Loaded(path.clone());
        Ok(Self { path })
    }

    /// [`NixlLibrary::load`] from the folder named by [`LIB_DIR_ENV`].
    pub fn from_env() -> Result<Self, NixlError> {
        let dir = std::env::var_os(LIB_DIR_ENV).ok_or(NixlError::LibraryDirUnset)?;
        Self::load(Path::new(&dir))
    }

    /// The library in use.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `dlopen`s `path` for the rest of the process.
fn open(path: &Path) -> Result<(), NixlError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| NixlError::LibraryLoad {
        path: path.to_owned(),
        reason: "path contains a NUL byte".to_owned(),
    })?;
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call. Loading
    // runs the library's initialisers, which is what using NIXL means; the handle is
    // deliberately never closed, since the stubs keep pointers into the library.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated message valid until the next
        // dl* call on this thread; it is copied before any other.
        let reason = unsafe {
            let message = libc::dlerror();
            if message.is_null() {
                "unknown dlopen error".to_owned()
            } else {
                CStr::from_ptr(message).to_string_lossy().into_owned()
            }
        };
        return Err(NixlError::LibraryLoad {
            path: path.to_owned(),
            reason,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_an_abort() {
        let dir = Path::new("/nonexistent/kvtwin-nixl");
        match NixlLibrary::load(dir) {
            Err(NixlError::LibraryMissing { path }) => {
                assert_eq!(path, dir.join(CAPI_LIBRARY))
            }
            // Another test of this binary may have loaded the real library already.
            Ok(_) => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn a_file_that_is_no_library_is_a_load_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CAPI_LIBRARY), b"not an ELF file").unwrap();
        match NixlLibrary::load(dir.path()) {
            Err(NixlError::LibraryLoad { reason, .. }) => assert!(!reason.is_empty()),
            Ok(_) => {}
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}
