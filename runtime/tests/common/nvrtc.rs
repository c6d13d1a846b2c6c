//! libnvrtc's C API loaded from an explicit path, for the suites that check CUDA C with NVRTC
//! (tests/cuda.rs and trainer/tests/device_kernels.rs, through `#[path]`).

#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

pub type Program = *mut c_void;

/// libnvrtc's C API, loaded from an explicit path.
pub struct Nvrtc {
    _library: libloading::Library,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
}

impl Nvrtc {
    pub fn load(path: &Path) -> Nvrtc {
        // SAFETY: NVIDIA's library; its initialisers have no preconditions.
        let library = unsafe { libloading::Library::new(path) }
            .unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
        // SAFETY: the signatures are those of nvrtc.h (nvrtcResult is an int enum, size_t is usize).
        unsafe {
            Nvrtc {
                create: *library.get(b"nvrtcCreateProgram").unwrap(),
                compile: *library.get(b"nvrtcCompileProgram").unwrap(),
                ptx_size: *library.get(b"nvrtcGetPTXSize").unwrap(),
                ptx: *library.get(b"nvrtcGetPTX").unwrap(),
                log_size: *library.get(b"nvrtcGetProgramLogSize").unwrap(),
                log: *library.get(b"nvrtcGetProgramLog").unwrap(),
                destroy: *library.get(b"nvrtcDestroyProgram").unwrap(),
                _library: library,
            }
        }
    }

    /// PTX for `arch` (e.g. compute_90) with NVRTC's log (its warnings), or the log of a failure.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
    ) -> Result<(String, String), String> {
        let source = CString::new(source).unwrap();
        let name = CString::new(name).unwrap();
        let options = [CString::new(format!("--gpu-architecture={arch}")).unwrap()];
        let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: valid C strings that outlive the calls; buffers sized by the size queries.
        unsafe {
            let status = (self.create)(
                &mut program,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            assert_eq!(status, 0, "nvrtcCreateProgram failed");
            let status = (self.compile)(program, pointers.len() as c_int, pointers.as_ptr());
            let mut size = 0usize;
            (self.log_size)(program, &mut size);
            let mut log = vec![0u8; size.max(1)];
            (self.log)(program, log.as_mut_ptr().cast());
            let log = CStr::from_bytes_until_nul(&log)
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let result = if status != 0 {
                Err(format!("NVRTC status {status}:\n{log}"))
            } else {
                let mut size = 0usize;
                (self.ptx_size)(program, &mut size);
                let mut ptx = vec![0u8; size.max(1)];
                (self.ptx)(program, ptx.as_mut_ptr().cast());
                let ptx = CStr::from_bytes_until_nul(&ptx)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Ok((ptx, log))
            };
            (self.destroy)(&mut program);
            result
        }
    }
}
