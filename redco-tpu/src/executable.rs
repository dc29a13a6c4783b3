//! Compiled programs: StableHLO text (or bytecode) compiled by the plugin, then executed on
//! one device or on every device of a replicated program.

use crate::api::pjrt_error;
use crate::buffer::Buffer;
use crate::client::Client;
use crate::ffi::{self, Sized as _};
use crate::pjrt;
use crate::proto::CompileOptions;
use redco_core::Result;

/// A loaded executable, destroyed when dropped.
pub struct Executable {
    client: Client,
    raw: *mut ffi::PJRT_LoadedExecutable,
    outputs: usize,
    replicas: usize,
}

// SAFETY: PJRT executables may be executed concurrently from any thread.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PjrtExecutable({} outputs, {} replicas)", self.outputs, self.replicas)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut a = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        a.executable = self.raw;
        let _ = pjrt!(self.client.inner.api, PJRT_LoadedExecutable_Destroy, &mut a);
    }
}

impl Client {
    /// Compiles an MLIR module (StableHLO text or bytecode) with `options`. A program XLA
    /// rejects is an error carrying XLA's message and `what` (the op it was built for).
    pub fn compile(&self, module: &[u8], options: &CompileOptions, what: &str) -> Result<Executable> {
        let api = self.inner.api;
        let format = "mlir";
        let mut program = ffi::PJRT_Program::new();
        program.code = module.as_ptr() as *mut _;
        program.code_size = module.len();
        program.format = format.as_ptr() as *const _;
        program.format_size = format.len();
        let opts = options.encode();
        let mut a = ffi::PJRT_Client_Compile_Args::new();
        a.client = self.inner.raw;
        a.program = &program;
        a.compile_options = opts.as_ptr() as *const _;
        a.compile_options_size = opts.len();
        pjrt!(api, PJRT_Client_Compile, &mut a)
            .map_err(|e| pjrt_error("compile", format!("XLA rejected the program of `{what}`: {e}")))?;
        let mut exe = Executable { client: self.clone(), raw: a.executable, outputs: 0, replicas: 1 };
        let mut g = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        g.loaded_executable = exe.raw;
        pjrt!(api, PJRT_LoadedExecutable_GetExecutable, &mut g)?;
        let mut n = ffi::PJRT_Executable_NumOutputs_Args::new();
        n.executable = g.executable;
        let outputs = pjrt!(api, PJRT_Executable_NumOutputs, &mut n).map(|_| n.num_outputs);
        let mut d = ffi::PJRT_Executable_Destroy_Args::new();
        d.executable = g.executable;
        let _ = pjrt!(api, PJRT_Executable_Destroy, &mut d);
        exe.outputs = outputs?;
        exe.replicas = options.num_replicas.max(1) as usize * options.num_partitions.max(1) as usize;
        Ok(exe)
    }
}

impl Executable {
    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.outputs
    }

    /// Runs a single-device (portable) program on device `device` of the client.
    pub fn execute(&self, device: usize, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let dev = self.client.device(device)?;
        let mut out = self.launch(&[args.to_vec()], Some(dev.raw))?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Runs a replicated program on every device it was compiled for; `args[r]` are the
    /// arguments of replica `r`, and so are the returned outputs.
    pub fn execute_replicated(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        if args.len() != self.replicas {
            return Err(pjrt_error(
                "execute",
                format!("the program runs on {} devices but {} argument lists were given", self.replicas, args.len()),
            ));
        }
        self.launch(args, None)
    }

    fn launch(&self, args: &[Vec<&Buffer>], device: Option<*mut ffi::PJRT_Device>) -> Result<Vec<Vec<Buffer>>> {
        let api = self.client.inner.api;
        let nargs = args.first().map_or(0, |a| a.len());
        if args.iter().any(|a| a.len() != nargs) {
            return Err(pjrt_error("execute", "every device needs the same number of arguments"));
        }
        let raw_args: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            args.iter().map(|a| a.iter().map(|b| b.raw).collect()).collect();
        let arg_ptrs: Vec<*const *mut ffi::PJRT_Buffer> = raw_args.iter().map(|a| a.as_ptr()).collect();
        let mut outs: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            args.iter().map(|_| vec![std::ptr::null_mut(); self.outputs]).collect();
        let out_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> = outs.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let mut opts = ffi::PJRT_ExecuteOptions::new();
        let mut a = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw;
        a.options = &mut opts;
        a.argument_lists = arg_ptrs.as_ptr();
        a.num_devices = args.len();
        a.num_args = nargs;
        a.output_lists = out_ptrs.as_ptr();
        // No completion events: execution is asynchronous, and a failure reaches the host
        // through the outputs (their download reports it).
        a.execute_device = device.unwrap_or(std::ptr::null_mut());
        pjrt!(api, PJRT_LoadedExecutable_Execute, &mut a)?;
        // Adopt every output before looking at errors, so all of them are destroyed.
        let adopted: Vec<Result<Vec<Buffer>>> =
            outs.iter().map(|o| o.iter().map(|&b| self.client.adopt(b)).collect()).collect();
        adopted.into_iter().collect()
    }
}
