//! Integration tests of the XLA layer against the real PJRT CPU plugin (no
//! mocks), through the API the node itself uses: programs compiled by the
//! client or the executor, run as a [`Run`]. The plugin is the node's:
//! `XLA_NODE_PJRT_PLUGIN`, else the default install location.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{plugin, run_host};
use xla_node::xla::{
    register_host_handler, Argument, Attr, Buffer, Client, CompileOptions, DType, Executable,
    Executor, HostTensor, Run, TensorSpec, XlaError,
};

fn client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::from_plugin(plugin()).expect("load PJRT CPU plugin"))
        .clone()
}

fn compile(program: &str) -> Arc<Executable> {
    Arc::new(client().compile(program.as_bytes()).unwrap())
}

fn devices(buffers: &[&Arc<Buffer>]) -> Vec<Argument> {
    buffers
        .iter()
        .map(|b| Argument::Device(Arc::clone(b)))
        .collect()
}

fn executor() -> Executor {
    static EXEC: OnceLock<Executor> = OnceLock::new();
    EXEC.get_or_init(|| Executor::new(client())).clone()
}

trait Le {
    fn le(&self) -> Vec<u8>;
}
macro_rules! impl_le {
    ($($t:ty),*) => {$(impl Le for $t { fn le(&self) -> Vec<u8> { self.to_le_bytes().to_vec() } })*};
}
impl_le!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

fn le<T: Le>(v: &[T]) -> Vec<u8> {
    v.iter().flat_map(|x| x.le()).collect()
}

fn t(dtype: DType, dims: &[i64], data: Vec<u8>) -> HostTensor {
    HostTensor::new(dtype, dims.to_vec(), data)
}

fn run(program: &str, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, XlaError> {
    let exe = Arc::new(client().compile(program.as_bytes())?);
    run_host(&exe, inputs)
}

/// `op(a, b)` on two `tensor<N x ty>` values.
fn binary(op: &str, mlir_ty: &str, dtype: DType, n: i64, a: Vec<u8>, b: Vec<u8>) -> Vec<u8> {
    let ty = format!("tensor<{n}x{mlir_ty}>");
    let program = format!(
        "func.func @main(%a: {ty}, %b: {ty}) -> {ty} {{\n  %0 = stablehlo.{op} %a, %b : {ty}\n  return %0 : {ty}\n}}\n"
    );
    let out = run(&program, &[t(dtype, &[n], a), t(dtype, &[n], b)]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dtype, dtype);
    assert_eq!(out[0].dims, vec![n]);
    out[0].data.clone()
}

#[test]
fn client_info() {
    let c = client();
    assert_eq!(c.platform_name(), "cpu");
    assert!(!c.devices().is_empty());
    assert!(c.devices().iter().any(|d| d.addressable));
    assert_eq!(c.api().version().0, 0);
}

#[test]
fn dtype_signed_integers() {
    assert_eq!(
        binary(
            "add",
            "i8",
            DType::S8,
            3,
            le(&[1i8, -2, 127]),
            le(&[1i8, 3, 1])
        ),
        le(&[2i8, 1, -128])
    );
    assert_eq!(
        binary(
            "multiply",
            "i8",
            DType::S8,
            3,
            le(&[3i8, -4, 64]),
            le(&[5i8, 6, 2])
        ),
        le(&[15i8, -24, -128])
    );
    assert_eq!(
        binary(
            "add",
            "i16",
            DType::S16,
            3,
            le(&[1000i16, -2000, 32767]),
            le(&[1i16, 2, 1])
        ),
        le(&[1001i16, -1998, -32768])
    );
    assert_eq!(
        binary(
            "multiply",
            "i32",
            DType::S32,
            3,
            le(&[100000i32, -3, 7]),
            le(&[3i32, 5, -2])
        ),
        le(&[300000i32, -15, -14])
    );
    assert_eq!(
        binary(
            "add",
            "i64",
            DType::S64,
            3,
            le(&[1i64 << 40, -5, i64::MAX]),
            le(&[1i64, 5, 1])
        ),
        le(&[(1i64 << 40) + 1, 0, i64::MIN])
    );
}

#[test]
fn dtype_unsigned_integers() {
    assert_eq!(
        binary(
            "add",
            "ui8",
            DType::U8,
            3,
            le(&[250u8, 1, 2]),
            le(&[10u8, 2, 3])
        ),
        le(&[4u8, 3, 5])
    );
    assert_eq!(
        binary(
            "multiply",
            "ui16",
            DType::U16,
            3,
            le(&[300u16, 2, 65535]),
            le(&[300u16, 3, 2])
        ),
        le(&[(90000u32 % 65536) as u16, 6, 65534])
    );
    assert_eq!(
        binary(
            "add",
            "ui32",
            DType::U32,
            3,
            le(&[u32::MAX, 1, 2]),
            le(&[1u32, 1, 2])
        ),
        le(&[0u32, 2, 4])
    );
    assert_eq!(
        binary(
            "multiply",
            "ui64",
            DType::U64,
            3,
            le(&[1u64 << 33, 3, 5]),
            le(&[1u64 << 31, 4, 5])
        ),
        le(&[0u64, 12, 25])
    );
}

fn bf16(x: f32) -> u16 {
    // Exact for the values used (no rounding needed).
    (x.to_bits() >> 16) as u16
}

#[test]
fn dtype_floats() {
    // f16 bit patterns: 1.0=3C00 2.0=4000 0.5=3800 3.0=4200 2.5=4100 1.5=3E00.
    assert_eq!(
        binary(
            "add",
            "f16",
            DType::F16,
            3,
            le(&[0x3C00u16, 0x4000, 0x3800]),
            le(&[0x4000u16, 0x3800, 0x3C00])
        ),
        le(&[0x4200u16, 0x4100, 0x3E00])
    );
    let a: Vec<u16> = [1.0f32, 2.0, 0.5].iter().map(|&x| bf16(x)).collect();
    let b: Vec<u16> = [2.0f32, 0.5, -4.0].iter().map(|&x| bf16(x)).collect();
    let want: Vec<u16> = [3.0f32, 2.5, -3.5].iter().map(|&x| bf16(x)).collect();
    assert_eq!(
        binary("add", "bf16", DType::BF16, 3, le(&a), le(&b)),
        le(&want)
    );
    assert_eq!(
        binary(
            "multiply",
            "f32",
            DType::F32,
            3,
            le(&[1.5f32, -2.0, 0.25]),
            le(&[2.0f32, 3.0, 4.0])
        ),
        le(&[3.0f32, -6.0, 1.0])
    );
    assert_eq!(
        binary(
            "add",
            "f64",
            DType::F64,
            3,
            le(&[0.1f64, 1e300, -1.0]),
            le(&[0.2f64, 1e300, 1.0])
        ),
        le(&[0.1f64 + 0.2, 2e300, 0.0])
    );
}

#[test]
fn dtype_complex() {
    // (1+2i)(0.5+0.5i) = -0.5+1.5i ; (3-i)(2+i) = 7+i
    assert_eq!(
        binary(
            "multiply",
            "complex<f32>",
            DType::C64,
            2,
            le(&[1.0f32, 2.0, 3.0, -1.0]),
            le(&[0.5f32, 0.5, 2.0, 1.0])
        ),
        le(&[-0.5f32, 1.5, 7.0, 1.0])
    );
    assert_eq!(
        binary(
            "add",
            "complex<f64>",
            DType::C128,
            2,
            le(&[1.0f64, 2.0, 3.0, 4.0]),
            le(&[0.5f64, -2.0, 1.0, 1.0])
        ),
        le(&[1.5f64, 0.0, 4.0, 5.0])
    );
}

#[test]
fn dtype_pred() {
    assert_eq!(
        binary(
            "and",
            "i1",
            DType::Pred,
            4,
            vec![1, 0, 1, 0],
            vec![1, 1, 0, 0]
        ),
        vec![1, 0, 0, 0]
    );
    assert_eq!(
        binary(
            "or",
            "i1",
            DType::Pred,
            4,
            vec![1, 0, 1, 0],
            vec![1, 1, 0, 0]
        ),
        vec![1, 1, 1, 0]
    );
    let program = "func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xi1> {
  %0 = stablehlo.compare GT, %a, %b : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
  return %0 : tensor<3xi1>
}";
    let out = run(
        program,
        &[
            t(DType::F32, &[3], le(&[1.0f32, 2.0, 3.0])),
            t(DType::F32, &[3], le(&[2.0f32, 2.0, 1.0])),
        ],
    )
    .unwrap();
    assert_eq!(out[0].dtype, DType::Pred);
    assert_eq!(out[0].data, vec![0, 0, 1]);
}

#[test]
fn convert_between_types() {
    let program = "func.func @main(%a: tensor<3xf32>, %b: tensor<2xi32>) -> (tensor<3xi32>, tensor<2xf64>, tensor<2xbf16>) {
  %0 = stablehlo.convert %a : (tensor<3xf32>) -> tensor<3xi32>
  %1 = stablehlo.convert %b : (tensor<2xi32>) -> tensor<2xf64>
  %2 = stablehlo.convert %b : (tensor<2xi32>) -> tensor<2xbf16>
  return %0, %1, %2 : tensor<3xi32>, tensor<2xf64>, tensor<2xbf16>
}";
    let out = run(
        program,
        &[
            t(DType::F32, &[3], le(&[1.5f32, -2.5, 3.9])),
            t(DType::S32, &[2], le(&[7i32, -3])),
        ],
    )
    .unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].data, le(&[1i32, -2, 3]));
    assert_eq!(out[1].data, le(&[7.0f64, -3.0]));
    assert_eq!(out[2].data, le(&[bf16(7.0), bf16(-3.0)]));
}

#[test]
fn multi_output() {
    let program = "func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>) {
  %0 = stablehlo.add %a, %b : tensor<2x2xf32>
  %1 = stablehlo.multiply %a, %b : tensor<2x2xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xf32>, tensor<f32>) -> tensor<f32>
  return %0, %1, %2 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<f32>
}";
    let exe = compile(program);
    let a = t(DType::F32, &[2, 2], le(&[1.0f32, 2.0, 3.0, 4.0]));
    let b = t(DType::F32, &[2, 2], le(&[5.0f32, 6.0, 7.0, 8.0]));
    let out = run_host(&exe, &[a, b]).unwrap();
    assert_eq!(
        out.iter().map(HostTensor::spec).collect::<Vec<_>>(),
        [
            TensorSpec::new(DType::F32, vec![2, 2]),
            TensorSpec::new(DType::F32, vec![2, 2]),
            TensorSpec::new(DType::F32, vec![]),
        ]
    );
    assert_eq!(out[0].data, le(&[6.0f32, 8.0, 10.0, 12.0]));
    assert_eq!(out[1].data, le(&[5.0f32, 12.0, 21.0, 32.0]));
    assert_eq!(out[2].dims, Vec::<i64>::new());
    assert_eq!(out[2].data, le(&[70.0f32]));
}

const MLP: &str = "module @mlp {
  func.func public @main(%x: tensor<2x3xf32>, %w: tensor<3x4xf32> {mhlo.sharding = \"{replicated}\"}, %b: tensor<4xf32>) -> (tensor<2xf32> {jax.result_info = \"\"}) {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    %1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
    %2 = stablehlo.add %0, %1 : tensor<2x4xf32>
    %3 = stablehlo.tanh %2 : tensor<2x4xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %4 = stablehlo.reduce(%3 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    return %4 : tensor<2xf32>
  }
}";

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn mlp_matches_rust() {
    let x: Vec<f32> = vec![0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
    let w: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) / 10.0).collect();
    let b: Vec<f32> = vec![0.1, -0.2, 0.3, -0.4];
    let mut want = [0f64; 2];
    for i in 0..2 {
        for j in 0..4 {
            let mut s = b[j] as f64;
            for k in 0..3 {
                s += x[i * 3 + k] as f64 * w[k * 4 + j] as f64;
            }
            want[i] += s.tanh();
        }
    }
    let exe = compile(MLP);
    assert_eq!(
        exe.parameters(),
        &[
            TensorSpec::new(DType::F32, vec![2, 3]),
            TensorSpec::new(DType::F32, vec![3, 4]),
            TensorSpec::new(DType::F32, vec![4]),
        ]
    );
    let out = run_host(
        &exe,
        &[
            t(DType::F32, &[2, 3], le(&x)),
            t(DType::F32, &[3, 4], le(&w)),
            t(DType::F32, &[4], le(&b)),
        ],
    )
    .unwrap();
    let got = f32s(&out[0].data);
    assert_eq!(got.len(), 2);
    for i in 0..2 {
        assert!(
            (got[i] as f64 - want[i]).abs() < 1e-5,
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn parameters_from_optimized_hlo_when_text_is_generic() {
    // Generic op form: no `@main(` signature to parse, so the parameter types
    // come from the optimized HLO module.
    let program = r#""builtin.module"() ({
  "func.func"() <{function_type = (tensor<2xf32>, tensor<3xi64>) -> tensor<2xf32>, sym_name = "main"}> ({
  ^bb0(%arg0: tensor<2xf32>, %arg1: tensor<3xi64>):
    "func.return"(%arg0) : (tensor<2xf32>) -> ()
  }) : () -> ()
}) : () -> ()
"#;
    let exe = compile(program);
    assert_eq!(
        exe.parameters(),
        &[
            TensorSpec::new(DType::F32, vec![2]),
            TensorSpec::new(DType::S64, vec![3])
        ]
    );
    let out = run_host(
        &exe,
        &[
            t(DType::F32, &[2], le(&[1.0f32, 2.0])),
            t(DType::S64, &[3], le(&[1i64, 2, 3])),
        ],
    )
    .unwrap();
    assert_eq!(out[0].data, le(&[1.0f32, 2.0]));
}

#[test]
fn invalid_programs_are_compile_errors() {
    let c = client();
    for bad in [
        &b""[..],
        b"   ",
        b"\xff\xfe\x00garbage",
        b"this is not mlir",
        b"func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> { %0 = stablehlo.bogus %a : tensor<3xf32> return %0 : tensor<3xf32> }",
        b"func.func @main(%a: tensor<3xf32>) -> tensor<4xf32> { return %a : tensor<3xf32> }",
        b"ML\xefR\x00\x01\x02garbage bytecode",
    ] {
        match c.compile(bad) {
            Err(XlaError::Compile(msg)) => assert!(!msg.is_empty()),
            other => panic!("expected compile error for {:?}, got {other:?}", String::from_utf8_lossy(bad)),
        }
    }
    // The client still works afterwards.
    assert_eq!(
        binary("add", "i32", DType::S32, 1, le(&[1i32]), le(&[2i32])),
        le(&[3i32])
    );
}

#[test]
fn argument_errors_name_the_index() {
    let c = client();
    let exe = compile(MLP);
    let buffer = |dtype, dims: &[i64]| {
        let size = TensorSpec::new(dtype, dims.to_vec()).byte_size();
        Arc::new(c.buffer_from_host(&vec![0u8; size], dtype, dims).unwrap())
    };
    let x = buffer(DType::F32, &[2, 3]);
    let w = buffer(DType::F32, &[3, 4]);
    let b = buffer(DType::F32, &[4]);
    let w64 = buffer(DType::S64, &[3, 4]);
    let w_t = buffer(DType::F32, &[4, 3]);
    let check = |args: &[&Arc<Buffer>]| Run::new(exe.clone(), vec![], devices(args)).unwrap_err();

    assert_eq!(
        check(&[&x, &w]),
        XlaError::Argument("expected 3 arguments, got 2".into())
    );
    let err = check(&[&x, &w, &b, &b]);
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.contains("expected 3 arguments, got 4")),
        "{err}"
    );
    assert_eq!(
        check(&[&x, &w64, &b]),
        XlaError::Argument(
            "argument 1: expected f32[3,4] (48 bytes), got s64[3,4] (96 bytes)".into()
        )
    );
    let err = check(&[&x, &w, &w_t]);
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.starts_with("argument 2: expected f32[4]")),
        "{err}"
    );
    let err = check(&[&x, &w_t, &b]);
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.contains("argument 1") && m.contains("got f32[4,3]")),
        "{err}"
    );

    // Byte size mismatches are caught before XLA sees them.
    let err = c
        .buffer_from_host(&[0u8; 20], DType::F32, &[2, 3])
        .unwrap_err();
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.contains("24 bytes")),
        "{err}"
    );
    let err = run_host(
        &exe,
        &[
            t(DType::F32, &[2, 3], vec![0; 24]),
            t(DType::F32, &[3, 4], vec![0; 47]),
            t(DType::F32, &[4], vec![0; 16]),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.starts_with("argument 1:") && m.contains("47 bytes")),
        "{err}"
    );
    let err = run_host(
        &exe,
        &[
            t(DType::F32, &[2, 3], vec![0; 24]),
            t(DType::F32, &[3, 4], vec![0; 48]),
            t(DType::F16, &[4], vec![0; 8]),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.starts_with("argument 2:") && m.contains("f16[4]")),
        "{err}"
    );

    // Arguments the node puts ahead of the caller's are not counted in the caller's errors.
    let leading = || vec![t(DType::F32, &[2, 3], vec![0; 24])];
    let err = Run::new(exe.clone(), leading(), devices(&[&w])).unwrap_err();
    assert_eq!(
        err,
        XlaError::Argument(
            "expected 2 arguments (after the callback handle the node supplies), got 1".into()
        )
    );
    let err = Run::new(exe.clone(), leading(), devices(&[&w64, &b])).unwrap_err();
    assert!(
        matches!(err, XlaError::Argument(ref m) if m.starts_with("argument 0: expected f32[3,4]")),
        "{err}"
    );
    let out = Run::new(exe.clone(), leading(), devices(&[&w, &b]))
        .unwrap()
        .execute()
        .unwrap();
    assert_eq!(out[0].to_host().unwrap(), vec![0u8; 8]);

    // Still runs with correct arguments.
    let out = Run::new(exe.clone(), vec![], devices(&[&x, &w, &b]))
        .unwrap()
        .execute()
        .unwrap();
    assert_eq!(out[0].to_host().unwrap(), vec![0u8; 8]);
}

#[test]
fn buffers_round_trip_and_report_types() {
    let c = client();
    for d in DType::ALL {
        let data: Vec<u8> = (0..TensorSpec::new(d, vec![2, 3]).byte_size())
            .map(|i| {
                if d == DType::Pred {
                    (i % 2) as u8
                } else {
                    // 6 two-bit elements leave the low 4 bits of the second byte unused.
                    (i as u8).wrapping_mul(0x35).wrapping_add(0x93)
                        & if d.bits() == 2 && i == 1 { 0xf0 } else { 0xff }
                }
            })
            .collect();
        let b = c.buffer_from_host(&data, d, &[2, 3]).unwrap();
        assert_eq!(b.dtype(), d);
        assert_eq!(b.dims(), &[2, 3]);
        assert_eq!(b.byte_size(), data.len());
        assert_eq!(b.to_host().unwrap(), data, "{d}");
    }
    let empty = c.buffer_from_host(&[], DType::F32, &[0, 3]).unwrap();
    assert_eq!(empty.to_host().unwrap(), Vec::<u8>::new());
}

/// Small host arguments go through input buffers the executable reuses: every run, on any
/// thread, must still compute with its own arguments, next to device buffers and empty arrays.
#[test]
fn each_run_sees_its_own_arguments() {
    let c = client();
    let exe = compile(
        "func.func @main(%x: tensor<4xf32>, %k: tensor<4xf32>, %e: tensor<0xf32>, %p: tensor<4xi1>) -> (tensor<4xf32>, tensor<0xf32>) {
  %0 = stablehlo.multiply %x, %k : tensor<4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<4xf32>
  %1 = stablehlo.select %p, %0, %z : tensor<4xi1>, tensor<4xf32>
  return %1, %e : tensor<4xf32>, tensor<0xf32>
}",
    );
    let k = Arc::new(
        c.buffer_from_host(&le(&[1.0f32, 2.0, 3.0, 4.0]), DType::F32, &[4])
            .unwrap(),
    );
    let empty = t(DType::F32, &[0], vec![]);
    std::thread::scope(|s| {
        for thread in 0..4 {
            let (exe, k, empty) = (&exe, &k, &empty);
            s.spawn(move || {
                for i in 0..200 {
                    let v = (thread * 1000 + i) as f32;
                    let x = t(DType::F32, &[4], le(&[v, v + 1.0, v + 2.0, v + 3.0]));
                    let p = t(DType::Pred, &[4], vec![1, (i % 2) as u8, 1, 0]);
                    let args = |x: HostTensor| {
                        vec![
                            Argument::Host(x),
                            Argument::Device(k.clone()),
                            Argument::Host(empty.clone()),
                            Argument::Host(p.clone()),
                        ]
                    };
                    let out = Run::new(exe.clone(), vec![], args(x))
                        .unwrap()
                        .execute()
                        .unwrap();
                    let second = if i % 2 == 1 { 2.0 * (v + 1.0) } else { 0.0 };
                    assert_eq!(
                        out[0].to_host().unwrap(),
                        le(&[v, second, 3.0 * (v + 2.0), 0.0]),
                        "thread {thread}, run {i}"
                    );
                    assert_eq!(out[1].to_host().unwrap(), Vec::<u8>::new());
                    if i % 50 == 0 {
                        let wrong = t(DType::F32, &[3], le(&[1.0f32, 2.0, 3.0]));
                        let err = Run::new(exe.clone(), vec![], args(wrong)).unwrap_err();
                        assert!(
                            matches!(err, XlaError::Argument(ref m) if m.contains("argument 0")),
                            "{err:?}"
                        );
                    }
                }
            });
        }
    });
    // The device argument is untouched by all of it.
    assert_eq!(k.to_host().unwrap(), le(&[1.0f32, 2.0, 3.0, 4.0]));
}

#[test]
fn compile_cache_hits() {
    let ex = Executor::new(client());
    let program = "func.func @main(%a: tensor<5xi32>) -> tensor<5xi32> {
  %0 = stablehlo.add %a, %a : tensor<5xi32>
  return %0 : tensor<5xi32>
}";
    let (e1, hit1) = ex.compile(program.as_bytes().to_vec()).unwrap();
    let (e2, hit2) = ex.compile(program.as_bytes().to_vec()).unwrap();
    assert!(!hit1);
    assert!(hit2);
    assert!(Arc::ptr_eq(&e1, &e2));
    let s = ex.stats();
    assert_eq!((s.compiles, s.cache_hits, s.cached), (1, 1, 1));
    // A failed compile is counted as such, and not cached.
    assert!(ex.compile(b"not mlir at all, main".to_vec()).is_err());
    let s = ex.stats();
    assert_eq!((s.compiles, s.cache_hits, s.cached), (1, 1, 1));
    assert_eq!(s.compile_errors, 1);
    let out = run_host(&e1, &[t(DType::S32, &[5], le(&[1i32, 2, 3, 4, 5]))]).unwrap();
    assert_eq!(out[0].data, le(&[2i32, 4, 6, 8, 10]));
}

#[test]
fn compile_cache_evicts_least_recently_used_unheld_programs() {
    let ex = Executor::with_cache_bound(client(), 2);
    let program = |k: i32| {
        format!(
            "func.func @main(%a: tensor<3xi32>) -> tensor<3xi32> {{
  %c = stablehlo.constant dense<{k}> : tensor<3xi32>
  %0 = stablehlo.add %a, %c : tensor<3xi32>
  return %0 : tensor<3xi32>
}}"
        )
        .into_bytes()
    };
    // Held throughout: beyond the bound, yet never evicted.
    let (held, _) = ex.compile(program(0)).unwrap();
    for k in 1..=4 {
        drop(ex.compile(program(k)).unwrap());
    }
    let s = ex.stats();
    assert_eq!((s.compiles, s.cached, s.evictions), (5, 2, 3));
    // The most recent unheld one stays; the earlier ones were destroyed and compile again.
    assert!(ex.compile(program(4)).unwrap().1);
    assert!(!ex.compile(program(1)).unwrap().1);
    assert!(ex.compile(program(0)).unwrap().1);
    let out = run_host(&held, &[t(DType::S32, &[3], le(&[1i32, 2, 3]))]).unwrap();
    assert_eq!(out[0].data, le(&[1i32, 2, 3]));
}

/// A `while` loop of `n` steps over a 16-element vector (shared with the integration tests).
const LONG_LOOP: &str = include_str!("fixtures/long_loop.mlir");

#[test]
fn long_run_does_not_block_tiny_runs() {
    let ex = executor();
    let (long, _) = ex.compile(LONG_LOOP.as_bytes().to_vec()).unwrap();
    let (tiny, _) = ex
        .compile(
            b"func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.multiply %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}"
            .to_vec(),
        )
        .unwrap();
    let x = t(DType::F32, &[16], vec![0u8; 64]);
    // Calibrate the iteration count for a ~2 s run (fastest of three probes,
    // since other tests may be loading the machine meanwhile).
    let probe = 100_000i64;
    let per_iter = (0..3)
        .map(|_| {
            let t0 = Instant::now();
            run_host(&long, &[t(DType::S64, &[], le(&[probe])), x.clone()]).unwrap();
            t0.elapsed().as_secs_f64() / probe as f64
        })
        .fold(f64::INFINITY, f64::min);
    let n = ((2.0 / per_iter) as i64).clamp(probe, 2_000_000_000);

    // Runs on the executor's pool, as the node's scheduler submits them.
    let on_pool = |exe: &Arc<Executable>, inputs: Vec<HostTensor>| {
        let (tx, rx) = mpsc::channel();
        let exe = exe.clone();
        ex.submit(Box::new(move || {
            let _ = tx.send(run_host(&exe, &inputs));
        }));
        rx
    };
    let start = Instant::now();
    let long_rx = on_pool(&long, vec![t(DType::S64, &[], le(&[n])), x]);
    std::thread::sleep(Duration::from_millis(100));
    let rxs: Vec<_> = (0..100)
        .map(|i| {
            on_pool(
                &tiny,
                vec![t(DType::F32, &[4], le(&[i as f32, 1.0, 2.0, 3.0]))],
            )
        })
        .collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let out = rx.recv().unwrap().unwrap();
        assert_eq!(out[0].data, le(&[(i * i) as f32, 1.0, 4.0, 9.0]));
    }
    let tiny_done = start.elapsed();
    assert!(
        matches!(long_rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "the long run finished before the tiny ones ({tiny_done:?})"
    );
    let out = long_rx.recv().unwrap().unwrap();
    let long_done = start.elapsed();
    assert_eq!(out[0].dims, vec![16]);
    assert!(long_done > tiny_done, "{long_done:?} vs {tiny_done:?}");
    assert!(
        long_done >= Duration::from_millis(500),
        "long run too short: {long_done:?}"
    );
    eprintln!("tiny runs done after {tiny_done:?}, long run after {long_done:?}");
}

fn callback_module(target: &str) -> String {
    format!(
        "module @cb {{
  func.func public @main(%pid: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {{
    %0 = stablehlo.custom_call @{target}(%pid, %x) {{api_version = 4 : i32, has_side_effect = true, backend_config = {{callback_id = array<i64: 7, 8, 9>, callback_id_size = 23 : ui64, num_aliased_data_outputs = 0 : ui64}}}} : (tensor<8xui8>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }}
}}"
    )
}

#[derive(Debug, Default, Clone)]
struct Seen {
    callback_id: Option<Attr>,
    callback_id_size: Option<Attr>,
    aliased: Option<Attr>,
    pid: Vec<u8>,
    x: Vec<f32>,
    x_dims: Vec<i64>,
}

#[test]
fn ffi_handler_sees_attributes_and_writes_results() {
    let c = client();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let fail = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let (s2, f2, c2) = (seen.clone(), fail.clone(), calls.clone());
    register_host_handler(
        &c,
        "xla_node_test_callback",
        Arc::new(move |frame| {
            c2.fetch_add(1, Ordering::SeqCst);
            if f2.load(Ordering::SeqCst) {
                return Err("boom".to_string());
            }
            let x: Vec<f32> = {
                let args = frame.args();
                let mut s = s2.lock().unwrap();
                s.callback_id = frame.attr("callback_id");
                s.callback_id_size = frame.attr("callback_id_size");
                s.aliased = frame.attr("num_aliased_data_outputs");
                s.pid = args[0].data.to_vec();
                s.x = f32s(args[1].data);
                s.x_dims = args[1].dims.clone();
                assert_eq!(args[1].dtype, Some(DType::F32));
                s.x.clone()
            };
            let mut rets = frame.rets_mut()?;
            let y: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
            rets[0].data.copy_from_slice(&le(&y));
            Ok(())
        }),
    )
    .unwrap();

    let exe = compile(&callback_module("xla_node_test_callback"));
    let pid = t(DType::U8, &[8], (1..=8).collect());
    let x = t(DType::F32, &[4], le(&[1.0f32, 2.0, 3.0, 4.0]));
    let out = run_host(&exe, &[pid.clone(), x.clone()]).unwrap();
    assert_eq!(out[0].data, le(&[3.0f32, 5.0, 7.0, 9.0]));
    {
        let s = seen.lock().unwrap().clone();
        assert_eq!(s.callback_id, Some(Attr::ArrayI64(vec![7, 8, 9])));
        assert_eq!(s.callback_id_size, Some(Attr::U64(23)));
        assert_eq!(s.aliased, Some(Attr::U64(0)));
        assert_eq!(s.pid, (1..=8).collect::<Vec<u8>>());
        assert_eq!(s.x, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(s.x_dims, vec![4]);
    }

    // A handler error surfaces as a runtime error with the handler's text ...
    fail.store(true, Ordering::SeqCst);
    let err = run_host(&exe, &[pid.clone(), x.clone()]).unwrap_err();
    assert!(
        matches!(err, XlaError::Runtime(ref m) if m.contains("boom")),
        "{err:?}"
    );
    eprintln!("handler error surfaced as: {err}");
    // ... and the executable keeps working.
    fail.store(false, Ordering::SeqCst);
    let out = run_host(&exe, &[pid, x]).unwrap();
    assert_eq!(out[0].data, le(&[3.0f32, 5.0, 7.0, 9.0]));
    assert!(calls.load(Ordering::SeqCst) >= 3);
}

#[test]
fn ffi_handler_panics_and_aliasing() {
    let c = client();
    register_host_handler(
        &c,
        "xla_node_test_alias",
        Arc::new(|frame| {
            let aliases = frame.ret_aliases();
            if aliases != vec![Some(1)] {
                return Err(format!("unexpected aliases {aliases:?}"));
            }
            let scale = match frame.attr("scale") {
                Some(Attr::F32(s)) => s,
                other => return Err(format!("bad scale attribute {other:?}")),
            };
            if scale < 0.0 {
                panic!("negative scale");
            }
            // The result aliases operand 1: update it in place.
            let mut rets = frame.rets_mut()?;
            let out = &mut rets[0].data;
            for chunk in out.chunks_exact_mut(4) {
                let v = f32::from_le_bytes((&*chunk).try_into().unwrap()) * scale;
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            Ok(())
        }),
    )
    .unwrap();
    let module = |scale: &str| {
        format!(
            "func.func @main(%pid: tensor<8xui8>, %x: tensor<4xf32>) -> tensor<4xf32> {{
  %0 = stablehlo.custom_call @xla_node_test_alias(%pid, %x) {{api_version = 4 : i32, has_side_effect = true, backend_config = {{scale = {scale} : f32}}, output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 1, operand_tuple_indices = []>]}} : (tensor<8xui8>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}}"
        )
    };
    let pid = t(DType::U8, &[8], vec![0; 8]);
    let x = t(DType::F32, &[4], le(&[1.0f32, -2.0, 3.0, 0.5]));
    let exe = compile(&module("2.0"));
    let out = run_host(&exe, &[pid.clone(), x.clone()]).unwrap();
    assert_eq!(out[0].data, le(&[2.0f32, -4.0, 6.0, 1.0]));

    let bad = compile(&module("-1.0"));
    let err = run_host(&bad, &[pid.clone(), x.clone()]).unwrap_err();
    assert!(
        matches!(err, XlaError::Runtime(ref m) if m.contains("negative scale")),
        "{err:?}"
    );
    let out = run_host(&exe, &[pid, x]).unwrap();
    assert_eq!(out[0].data, le(&[2.0f32, -4.0, 6.0, 1.0]));
}

#[test]
fn unregistered_target_is_a_compile_error() {
    let err = client()
        .compile(callback_module("xla_node_never_registered").as_bytes())
        .unwrap_err();
    assert!(
        matches!(err, XlaError::Compile(ref m) if m.contains("xla_node_never_registered")),
        "{err:?}"
    );
}

// ----- The types Nx has beyond the classic ones: s2, s4, u2, u4, f8 (E5M2), f8_e4m3fn -----
//
// Tensors hold their bytes as Nx packs them: 2- and 4-bit elements share bytes, element 0 in
// the most significant bits (`s4 [7, -8]` is `0x78`), the unused low bits of the last byte zero.

/// The new types.
const NEW_TYPES: [DType; 6] = [
    DType::S2,
    DType::S4,
    DType::U2,
    DType::U4,
    DType::F8E5M2,
    DType::F8E4M3FN,
];

/// Every value of a type, in Nx's bytes, and its value as an f32: the 4 or 16 integers of a
/// 2- or 4-bit type (counting up from 0 in their bits), the 256 bit patterns of an 8-bit float.
fn every_value(dtype: DType) -> (Vec<u8>, Vec<f32>) {
    let signed = matches!(dtype, DType::S2 | DType::S4);
    match dtype.bits() {
        2 => (
            vec![0b00_01_10_11],
            if signed {
                vec![0.0, 1.0, -2.0, -1.0]
            } else {
                vec![0.0, 1.0, 2.0, 3.0]
            },
        ),
        4 => (
            vec![0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef],
            (0..16)
                .map(|v| if signed && v >= 8 { v - 16 } else { v } as f32)
                .collect(),
        ),
        _ => {
            let bytes: Vec<u8> = (0..=255).collect();
            let values = bytes.iter().map(|&b| f8_value(dtype, b)).collect();
            (bytes, values)
        }
    }
}

/// The value of an 8-bit float, decoded from its fields.
fn f8_value(dtype: DType, b: u8) -> f32 {
    let (exponent_bits, bias) = if dtype == DType::F8E5M2 {
        (5, 15)
    } else {
        (4, 7)
    };
    let mantissa_bits = 7 - exponent_bits;
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b & 0x7f) >> mantissa_bits);
    let m = f32::from(b & ((1 << mantissa_bits) - 1));
    let max_e = (1 << exponent_bits) - 1;
    let scale = (1 << mantissa_bits) as f32;
    match dtype {
        DType::F8E5M2 if e == max_e => {
            if m == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        DType::F8E4M3FN if e == max_e && m == 7.0 => f32::NAN,
        _ if e == 0 => sign * m / scale * 2f32.powi(1 - bias),
        _ => sign * (1.0 + m / scale) * 2f32.powi(e - bias),
    }
}

#[test]
fn new_types_round_trip_bit_for_bit() {
    let c = client();
    let identity = |ty: &str, dims: &str| {
        compile(&format!(
            "func.func @main(%a: tensor<{dims}{ty}>) -> tensor<{dims}{ty}> {{\n  return %a : tensor<{dims}{ty}>\n}}\n"
        ))
    };
    for dtype in NEW_TYPES {
        let ty = dtype.mlir();
        for dims in [
            vec![],
            vec![0],
            vec![1],
            vec![3],
            vec![5],
            vec![2, 3],
            vec![17, 3],
        ] {
            let spec = TensorSpec::new(dtype, dims.clone());
            let mut data: Vec<u8> = (0..spec.byte_size())
                .map(|i| (i as u8).wrapping_mul(0x9d) ^ 0x5a)
                .collect();
            // The unused low bits of the last byte are zero, as in Nx's binaries.
            if let Some(last) = data.last_mut() {
                *last &= 0xffu8 << ((8 - spec.bit_size() % 8) % 8);
            }
            let b = c.buffer_from_host(&data, dtype, &dims).unwrap();
            assert_eq!(b.byte_size(), data.len(), "{spec}");
            assert_eq!(b.to_host().unwrap(), data, "{spec}: host -> device -> host");
            // Through a program: staged host arguments, device arguments and outputs.
            let dims_text: String = dims.iter().map(|d| format!("{d}x")).collect();
            let exe = identity(ty, &dims_text);
            for _ in 0..2 {
                let out = run_host(&exe, &[t(dtype, &dims, data.clone())]).unwrap();
                assert_eq!(out[0].spec(), spec);
                assert_eq!(out[0].data, data, "{spec}: through a program");
            }
            let b = Arc::new(b);
            let out = Run::new(exe, vec![], devices(&[&b]))
                .unwrap()
                .execute()
                .unwrap();
            assert_eq!(out[0].to_host().unwrap(), data, "{spec}: device argument");
        }
    }
}

#[test]
fn new_types_convert_to_f32_and_back() {
    for dtype in NEW_TYPES {
        let ty = dtype.mlir();
        let (bytes, values) = every_value(dtype);
        let n = values.len();
        let program = format!(
            "func.func @main(%a: tensor<{n}x{ty}>) -> (tensor<{n}xf32>, tensor<{n}x{ty}>) {{
  %0 = stablehlo.convert %a : (tensor<{n}x{ty}>) -> tensor<{n}xf32>
  %1 = stablehlo.convert %0 : (tensor<{n}xf32>) -> tensor<{n}x{ty}>
  return %0, %1 : tensor<{n}xf32>, tensor<{n}x{ty}>
}}"
        );
        let out = run(&program, &[t(dtype, &[n as i64], bytes.clone())]).unwrap();
        let got = f32s(&out[0].data);
        for (i, (g, want)) in got.iter().zip(&values).enumerate() {
            assert!(
                g.to_bits() == want.to_bits() || g.is_nan() && want.is_nan(),
                "{dtype} element {i} ({:#04x}): {g} as f32, expected {want}",
                bytes.get(i).copied().unwrap_or_default()
            );
        }
        // Back from f32: every value comes back with its bits; NaNs stay NaNs.
        assert_eq!(out[1].dtype, dtype);
        for (i, (&back, &orig)) in out[1].data.iter().zip(&bytes).enumerate() {
            let nan = dtype.bits() == 8 && values[i].is_nan();
            assert!(
                back == orig || nan && f8_value(dtype, back).is_nan(),
                "{dtype} byte {i}: {back:#04x} back from f32, expected {orig:#04x}"
            );
        }
    }
}

#[test]
fn new_types_arithmetic() {
    // (op, type, element count, a, b, a op b, what): integers wrap around within their bits.
    type Case = (
        &'static str,
        DType,
        i64,
        &'static [u8],
        &'static [u8],
        &'static [u8],
    );
    #[rustfmt::skip]
    let cases: [(Case, &str); 6] = [
        (("add", DType::S4, 4, &[0x78, 0x3f], &[0x1f, 0x4f], &[0x87, 0x7e]),
            "s4 [7, -8, 3, -1] + [1, -1, 4, -1] = [-8, 7, 7, -2]"),
        (("add", DType::U4, 3, &[0xf1, 0x90], &[0x12, 0x90], &[0x03, 0x20]),
            "u4 [15, 1, 9] + [1, 2, 9] = [0, 3, 2]"),
        (("multiply", DType::U2, 4, &[0xe7], &[0xfa], &[0x6a]),
            "u2 [3, 2, 1, 3] * [3, 3, 2, 2] = [1, 2, 2, 2]"),
        (("subtract", DType::S2, 3, &[0x60], &[0xd4], &[0x9c]),
            "s2 [1, -2, 0] - [-1, 1, 1] = [-2, 1, -1]"),
        (("add", DType::F8E5M2, 3, &[0x3e, 0xc0, 0x34], &[0x40, 0x38, 0x34], &[0x43, 0xbe, 0x38]),
            "f8 [1.5, -2.0, 0.25] + [2.0, 0.5, 0.25] = [3.5, -1.5, 0.5]"),
        (("multiply", DType::F8E4M3FN, 3, &[0x3c, 0xc0, 0x28], &[0x40, 0x30, 0x48], &[0x44, 0xb8, 0x38]),
            "f8_e4m3fn [1.5, -2.0, 0.25] * [2.0, 0.5, 4.0] = [3.0, -1.0, 1.0]"),
    ];
    for ((op, dtype, n, a, b, want), what) in cases {
        assert_eq!(
            binary(op, dtype.mlir(), dtype, n, a.to_vec(), b.to_vec()),
            want,
            "{what}"
        );
    }
    // A 4-bit sort and dot product, which XLA's CPU backend computes right.
    let out = run(
        "func.func @main(%a: tensor<5xi4>) -> (tensor<5xi4>, tensor<i4>) {
  %0 = \"stablehlo.sort\"(%a) ({
  ^bb0(%x: tensor<i4>, %y: tensor<i4>):
    %c = stablehlo.compare LT, %x, %y : (tensor<i4>, tensor<i4>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }) {dimension = 0 : i64, is_stable = true} : (tensor<5xi4>) -> tensor<5xi4>
  %1 = stablehlo.dot_general %a, %a, contracting_dims = [0] x [0] : (tensor<5xi4>, tensor<5xi4>) -> tensor<i4>
  return %0, %1 : tensor<5xi4>, tensor<i4>
}",
        // [3, -8, 7, 0, -1]
        &[t(DType::S4, &[5], vec![0x38, 0x70, 0xf0])],
    )
    .unwrap();
    assert_eq!(
        out[0].data,
        vec![0x8f, 0x03, 0x70],
        "sorted: [-8, -1, 0, 3, 7]"
    );
    // 9 + 64 + 49 + 0 + 1 = 123 = 0b111_1011: its low 4 bits, -5.
    assert_eq!(out[1].data, vec![0xb0]);
}

#[test]
fn two_bit_concatenate_and_sort_are_refused() {
    let concat = "func.func @main(%a: tensor<3xi2>, %b: tensor<2xi2>) -> tensor<5xi2> {
  %0 = stablehlo.concatenate %a, %b, dim = 0 : (tensor<3xi2>, tensor<2xi2>) -> tensor<5xi2>
  return %0 : tensor<5xi2>
}";
    let sort = "func.func @main(%a: tensor<9xui2>) -> tensor<9xui2> {
  %0 = \"stablehlo.sort\"(%a) ({
  ^bb0(%x: tensor<ui2>, %y: tensor<ui2>):
    %c = stablehlo.compare LT, %x, %y : (tensor<ui2>, tensor<ui2>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }) {dimension = 0 : i64, is_stable = true} : (tensor<9xui2>) -> tensor<9xui2>
  return %0 : tensor<9xui2>
}";
    for (program, refusal) in [
        (concat, "concatenate of 2-bit integers"),
        (sort, "sort of 2-bit integers"),
    ] {
        let err = client().compile(program.as_bytes()).unwrap_err();
        assert!(
            matches!(err, XlaError::Compile(ref m) if m.contains(refusal)),
            "{err:?}"
        );
    }
    // The same on 4-bit integers compiles, and 2-bit integers still work elsewhere.
    assert!(client()
        .compile(concat.replace("i2>", "i4>").as_bytes())
        .is_ok());
    assert!(client()
        .compile(sort.replace("ui2>", "ui4>").as_bytes())
        .is_ok());
    assert_eq!(
        binary("add", "ui2", DType::U2, 4, vec![0x1b], vec![0x55]),
        vec![0x6c],
        "u2 [0, 1, 2, 3] + 1"
    );
}

/// XLA's CPU compiler throws a C++ exception (out of `PJRT_Client_Compile`) building the copy
/// it makes of a transpose of 2- or 4-bit integers that is one result among several. The
/// exception is caught at the plugin boundary: a compile error saying so, and the process (and
/// the executor) goes on compiling and running.
#[test]
fn a_throwing_compile_is_a_compile_error() {
    let ex = Executor::new(client());
    for ty in ["i2", "i4", "ui2", "ui4"] {
        let program = format!(
            "func.func @main(%a: tensor<2x3x{ty}>) -> (tensor<3x2x{ty}>, tensor<2x3x{ty}>) {{
  %0 = stablehlo.transpose %a, dims = [1, 0] : (tensor<2x3x{ty}>) -> tensor<3x2x{ty}>
  return %0, %a : tensor<3x2x{ty}>, tensor<2x3x{ty}>
}}"
        );
        let err = ex.compile(program.into_bytes()).unwrap_err();
        assert!(
            matches!(err, XlaError::Compile(ref m)
                if m.starts_with("XLA's compiler failed: it threw a C++ exception (")),
            "{ty}: {err:?}"
        );
    }
    let s = ex.stats();
    assert_eq!((s.compiles, s.compile_errors, s.cached), (0, 4, 0));
    // The same transpose of 8-bit integers compiles and runs, in the same executor.
    let (exe, _) = ex
        .compile(
            b"func.func @main(%a: tensor<2x3xi8>) -> (tensor<3x2xi8>, tensor<2x3xi8>) {
  %0 = stablehlo.transpose %a, dims = [1, 0] : (tensor<2x3xi8>) -> tensor<3x2xi8>
  return %0, %a : tensor<3x2xi8>, tensor<2x3xi8>
}"
            .to_vec(),
        )
        .unwrap();
    let out = run_host(&exe, &[t(DType::S8, &[2, 3], le(&[1i8, 2, 3, 4, 5, 6]))]).unwrap();
    assert_eq!(out[0].data, le(&[1i8, 4, 2, 5, 3, 6]));
    assert_eq!(out[1].data, le(&[1i8, 2, 3, 4, 5, 6]));
}

#[test]
fn ffi_handler_reads_and_writes_new_types_as_nx_packs_them() {
    let c = client();
    /// Each operand's type and bytes, as the handler saw them.
    type Operands = Vec<(Option<DType>, Vec<u8>)>;
    let seen: Arc<Mutex<Operands>> = Arc::default();
    let s2 = seen.clone();
    register_host_handler(
        &c,
        "xla_node_test_packed",
        Arc::new(move |frame| {
            *s2.lock().unwrap() = frame
                .args()
                .iter()
                .map(|a| (a.dtype, a.to_nx_bytes()))
                .collect();
            let mut rets = frame.rets_mut()?;
            // s4 [-1, 2, -8] and f8_e4m3fn [-1.0]
            rets[0].write_nx_bytes(&[0xf2, 0x80]);
            rets[1].write_nx_bytes(&[0xb8]);
            Ok(())
        }),
    )
    .unwrap();
    let exe = compile(
        "func.func @main(%a: tensor<5xui4>, %b: tensor<3xi2>, %c: tensor<2xf8E5M2>) -> (tensor<3xf32>, tensor<f32>) {
  %0:2 = stablehlo.custom_call @xla_node_test_packed(%a, %b, %c) {api_version = 4 : i32, has_side_effect = true} : (tensor<5xui4>, tensor<3xi2>, tensor<2xf8E5M2>) -> (tensor<3xi4>, tensor<f8E4M3FN>)
  %1 = stablehlo.convert %0#0 : (tensor<3xi4>) -> tensor<3xf32>
  %2 = stablehlo.convert %0#1 : (tensor<f8E4M3FN>) -> tensor<f32>
  return %1, %2 : tensor<3xf32>, tensor<f32>
}",
    );
    let a = t(DType::U4, &[5], vec![0x12, 0x34, 0x50]); // [1, 2, 3, 4, 5]
    let b = t(DType::S2, &[3], vec![0x6c]); // [1, -2, -1]
    let f = t(DType::F8E5M2, &[2], vec![0x3c, 0xc2]); // [1.0, -3.0]
    let out = run_host(&exe, &[a.clone(), b.clone(), f.clone()]).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (Some(DType::U4), a.data),
            (Some(DType::S2), b.data),
            (Some(DType::F8E5M2), f.data)
        ]
    );
    assert_eq!(f32s(&out[0].data), vec![-1.0, 2.0, -8.0]);
    assert_eq!(f32s(&out[1].data), vec![-1.0]);
}

/// The rule of `server::schedule`: nothing waits on XLA on a thread of the async runtime, whose
/// tasks serve the network. Debug builds check it where the node waits on XLA events.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "waiting on an XLA event on a thread of the async runtime")]
fn waiting_on_xla_from_the_runtime_is_caught() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _ = run(
            "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n  return %x : tensor<2xf32>\n}\n",
            &[t(DType::F32, &[2], le(&[1.0f32, 2.0]))],
        );
    });
}

/// A buffer written in pieces as they arrive comes out as the whole tensor, usable by a run;
/// one abandoned halfway costs nothing but itself, and the client goes on.
#[test]
fn device_upload_in_pieces() {
    use xla_node::xla::DeviceUpload;
    let values: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut upload = DeviceUpload::new(&client(), DType::F32, &[10_000], 0).unwrap();
    assert_eq!(upload.size(), 40_000);
    for piece in bytes.chunks(7_000) {
        upload.write(piece).unwrap();
    }
    let err = upload.write(&[0]).unwrap_err();
    assert!(
        err.message()
            .contains("takes 40000 bytes; 1 more after 40000"),
        "{err}"
    );
    let buffer = upload.finish().unwrap();
    assert_eq!(buffer.to_host_tensor().unwrap().data, bytes);

    let mut abandoned = DeviceUpload::new(&client(), DType::F32, &[10_000], 0).unwrap();
    abandoned.write(&bytes[..12_000]).unwrap();
    drop(abandoned);
    let short = DeviceUpload::new(&client(), DType::U8, &[4], 0).unwrap();
    assert!(short
        .finish()
        .unwrap_err()
        .message()
        .contains("takes 4 bytes, 0 were written"));
    assert!(DeviceUpload::new(&client(), DType::S4, &[4], 0).is_err());
    // The client goes on.
    let again = client()
        .buffer_from_host(&bytes, DType::F32, &[10_000])
        .unwrap();
    assert_eq!(again.to_host_tensor().unwrap().data, bytes);
}

/// A run's results handed over once `Execute` has returned, before a large program completes:
/// readable (a read waits for them), usable as the next run's arguments, and the call itself
/// returns only once the run has completed.
#[test]
fn results_handed_over_at_launch_carry_their_readiness() {
    let exe = compile(
        r#"
func.func @main(%s: tensor<f32>) -> tensor<512x512xf32> {
  %a = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<512x512xf32>
  %b = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  %c = stablehlo.dot_general %b, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  return %c : tensor<512x512xf32>
}
"#,
    );
    let scalar = |v: f32| HostTensor::new(DType::F32, vec![], v.to_le_bytes().to_vec());
    let run = Run::new(exe.clone(), vec![], vec![Argument::Host(scalar(0.25))]).unwrap();
    let mut handed = Vec::new();
    run.execute_handing_over(&mut |_| {}, &mut |outputs| handed = outputs)
        .unwrap();
    assert_eq!(handed.len(), 1);
    let first = Arc::new(handed.pop().unwrap());
    // 0.25^3 * 512^2: exact in f32.
    let expected = (0.25f32.powi(3) * 512.0 * 512.0).to_le_bytes();
    assert_eq!(first.to_host().unwrap()[..4], expected);

    // A handed buffer as the argument of a run whose results are handed over too.
    let sum = compile(
        r#"
func.func @main(%x: tensor<512x512xf32>) -> tensor<f32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %t = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<512x512xf32>, tensor<f32>) -> tensor<f32>
  return %t : tensor<f32>
}
"#,
    );
    let fresh = Run::new(exe.clone(), vec![], vec![Argument::Host(scalar(0.25))]).unwrap();
    let mut pending = Vec::new();
    fresh
        .execute_handing_over(&mut |_| {}, &mut |outputs| pending = outputs)
        .unwrap();
    let pending = Arc::new(pending.pop().unwrap());
    let total = Run::new(sum, vec![], devices(&[&pending])).unwrap();
    let mut totals = Vec::new();
    total
        .execute_handing_over(&mut |_| {}, &mut |outputs| totals = outputs)
        .unwrap();
    let expected = (0.25f32.powi(3) * 512.0 * 512.0 * 512.0 * 512.0).to_le_bytes();
    assert_eq!(totals[0].to_host().unwrap(), expected);
}

const ADD_F32: &str = "func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
  %0 = stablehlo.add %a, %b : tensor<3xf32>
  return %0 : tensor<3xf32>
}";

fn buffer_f32s(buffer: &Buffer) -> Vec<f32> {
    f32s(&buffer.to_host().unwrap())
}

#[test]
fn one_executable_runs_on_every_device_where_its_buffers_are() {
    let c = client();
    assert!(
        c.device_count() >= 2,
        "the CPU plugin shows several devices"
    );
    let exe = compile(ADD_F32);
    for device in 0..c.device_count() {
        let on = |v: [f32; 3]| {
            Arc::new(
                c.buffer_from_host_on(&le(&v), DType::F32, &[3], device)
                    .unwrap(),
            )
        };
        let (a, b) = (on([1.0, 2.0, 3.0]), on([10.0, 20.0, 30.0]));
        assert_eq!(a.device(), device);
        let run = Run::new(exe.clone(), vec![], devices(&[&a, &b])).unwrap();
        assert_eq!(run.device(), device, "a run goes where its buffers are");
        let out = run.execute().unwrap();
        assert_eq!(out[0].device(), device, "its result stays there");
        assert_eq!(out[0].reported_device(), Some(device), "as PJRT says too");
        assert_eq!(a.reported_device(), Some(device));
        // The result is a buffer of that device: it runs again with another one of it.
        let again = Run::new(
            exe.clone(),
            vec![],
            devices(&[&Arc::new(out.into_iter().next().unwrap()), &b]),
        )
        .unwrap()
        .execute()
        .unwrap();
        assert_eq!(buffer_f32s(&again[0]), [21.0, 42.0, 63.0]);
        // Host arguments go to the device asked for.
        let host = t(DType::F32, &[3], le(&[1.0f32, 1.0, 1.0]));
        let run = Run::on_device(
            exe.clone(),
            vec![],
            vec![Argument::Host(host.clone()), Argument::Host(host)],
            Some(device),
        )
        .unwrap();
        let out = run.execute().unwrap();
        assert_eq!(
            (out[0].device(), buffer_f32s(&out[0])),
            (device, vec![2.0, 2.0, 2.0])
        );
    }
}

#[test]
fn buffers_on_another_device_are_refused_naming_both() {
    let c = client();
    let exe = compile(ADD_F32);
    let on = |device| {
        Arc::new(
            c.buffer_from_host_on(&le(&[0f32; 3]), DType::F32, &[3], device)
                .unwrap(),
        )
    };
    let names = |i: usize| c.device_name(i);
    let err = Run::new(exe.clone(), vec![], devices(&[&on(0), &on(1)])).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("argument 1 is on device {}", names(1))),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "the run is on device {} (where argument 0 is)",
            names(0)
        )),
        "{text}"
    );
    let err = Run::on_device(exe.clone(), vec![], devices(&[&on(1), &on(1)]), Some(2)).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "argument 0 is on device {}, but the run is on device {}:",
            names(1),
            names(2)
        )),
        "{err}"
    );
    let n = c.device_count();
    let err = Run::on_device(exe.clone(), vec![], devices(&[&on(0), &on(0)]), Some(n)).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "device {n} is out of range: this node has {n} devices"
        )),
        "{err}"
    );
    let err = c
        .buffer_from_host_on(&le(&[0f32; 3]), DType::F32, &[3], n)
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

/// An MLP layer with the batch split over two devices and the weight whole on each; the second
/// result, the sum of every input, needs the devices to add up their parts.
const SPMD_LAYER: &str = r#"module @spmd attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<4x3xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}, %w: tensor<3x2xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"}, tensor<f32> {mhlo.sharding = "{replicated}"}) {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x3xf32>, tensor<3x2xf32>) -> tensor<4x2xf32>
    %1 = stablehlo.tanh %0 : tensor<4x2xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %2 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<f32>
    return %1, %2 : tensor<4x2xf32>, tensor<f32>
  }
}"#;

#[test]
fn an_spmd_program_runs_on_two_devices_with_one_shard_each() {
    let c = client();
    let devices = vec![c.device_id(1).unwrap(), c.device_id(3).unwrap()];
    let exe = Arc::new(
        c.compile_with_options(SPMD_LAYER.as_bytes(), &CompileOptions::partitioned(devices))
            .unwrap(),
    );
    assert_eq!(exe.partition_devices(), [1, 3]);
    assert_eq!(
        exe.parameters(),
        [
            TensorSpec::new(DType::F32, vec![2, 3]),
            TensorSpec::new(DType::F32, vec![3, 2])
        ],
        "each device takes its shard"
    );
    let x: Vec<f32> = (0..12).map(|i| i as f32 / 10.0).collect();
    let w: Vec<f32> = vec![0.5, -0.5, 0.25, 1.0, -1.0, 0.1];
    let shard =
        |rows: std::ops::Range<usize>| t(DType::F32, &[2, 3], le(&x[rows.start * 3..rows.end * 3]));
    let weight = || t(DType::F32, &[3, 2], le(&w));
    let on_3 = Arc::new(
        c.buffer_from_host_on(&le(&w), DType::F32, &[3, 2], 3)
            .unwrap(),
    );
    let run = Run::partitioned(
        exe.clone(),
        vec![
            vec![Argument::Host(shard(0..2)), Argument::Host(weight())],
            vec![Argument::Host(shard(2..4)), Argument::Device(on_3.clone())],
        ],
    )
    .unwrap();
    let out = run.execute().unwrap();
    assert_eq!(out.len(), 4, "two results on each of two devices");
    assert_eq!(
        out.iter().map(|b| b.reported_device()).collect::<Vec<_>>(),
        [Some(1), Some(1), Some(3), Some(3)]
    );
    let expected: Vec<f32> = (0..4)
        .flat_map(|r| (0..2).map(move |col| (r, col)))
        .map(|(r, col)| {
            (0..3)
                .map(|k| x[r * 3 + k] * w[k * 2 + col])
                .sum::<f32>()
                .tanh()
        })
        .collect();
    let mut got = buffer_f32s(&out[0]);
    got.extend(buffer_f32s(&out[2]));
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() < 1e-5, "{got:?} vs {expected:?}");
    }
    let total: f32 = x.iter().sum();
    assert!((buffer_f32s(&out[1])[0] - total).abs() < 1e-4);
    assert!((buffer_f32s(&out[3])[0] - total).abs() < 1e-4);

    // A buffer on another device than its partition's, and the wrong number of lists.
    let err = Run::partitioned(
        exe.clone(),
        vec![
            vec![Argument::Host(shard(0..2)), Argument::Device(on_3.clone())],
            vec![Argument::Host(shard(2..4)), Argument::Device(on_3)],
        ],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "device 0 ({}): argument 1 is on device {}",
            c.device_name(1),
            c.device_name(3)
        )),
        "{err}"
    );
    let err = Run::partitioned(exe.clone(), vec![vec![]]).unwrap_err();
    assert!(
        err.to_string()
            .contains("runs on 2 devices at once, got 1 lists"),
        "{err}"
    );
    let err = Run::new(exe, vec![], vec![]).unwrap_err();
    assert!(
        err.to_string()
            .contains("give one list of arguments per device"),
        "{err}"
    );
}

/// The layer above without the sum: its partitions exchange nothing.
const SPMD_LOCAL_LAYER: &str = r#"module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<8x3xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}, %w: tensor<3x2xf32> {mhlo.sharding = "{replicated}"}) -> (tensor<8x2xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}) {
    %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x3xf32>, tensor<3x2xf32>) -> tensor<8x2xf32>
    %1 = stablehlo.tanh %0 : tensor<8x2xf32>
    return %1 : tensor<8x2xf32>
  }
}"#;

#[test]
fn partitions_that_exchange_nothing_run_each_on_its_device_run_after_run() {
    let c = client();
    let devices: Vec<i64> = (0..4).map(|d| c.device_id(d).unwrap()).collect();
    let local = Arc::new(
        c.compile_with_options(
            SPMD_LOCAL_LAYER.as_bytes(),
            &CompileOptions::partitioned(devices.clone()),
        )
        .unwrap(),
    );
    assert!(!local.partitions_communicate());
    let summing = c
        .compile_with_options(
            SPMD_LAYER.as_bytes(),
            &CompileOptions::partitioned(devices[..2].to_vec()),
        )
        .unwrap();
    assert!(summing.partitions_communicate(), "an all-reduce");
    let w: Vec<f32> = vec![0.5, -0.5, 0.25, 1.0, -1.0, 0.1];
    let weights: Vec<Arc<Buffer>> = (0..4)
        .map(|d| {
            Arc::new(
                c.buffer_from_host_on(&le(&w), DType::F32, &[3, 2], d)
                    .unwrap(),
            )
        })
        .collect();
    // Several runs, new rows each time: each device's reused input buffers are refilled.
    for run in 0..3 {
        let x: Vec<f32> = (0..24).map(|i| (i + run * 24) as f32 / 50.0).collect();
        let lists = (0..4)
            .map(|d| {
                vec![
                    Argument::Host(t(DType::F32, &[2, 3], le(&x[d * 6..(d + 1) * 6]))),
                    Argument::Device(weights[d].clone()),
                ]
            })
            .collect();
        let out = Run::partitioned(local.clone(), lists)
            .unwrap()
            .execute()
            .unwrap();
        assert_eq!(
            out.iter().map(|b| b.reported_device()).collect::<Vec<_>>(),
            [Some(0), Some(1), Some(2), Some(3)]
        );
        let got: Vec<f32> = out.iter().flat_map(buffer_f32s).collect();
        for (i, g) in got.iter().enumerate() {
            let (r, col) = (i / 2, i % 2);
            let e = (0..3)
                .map(|k| x[r * 3 + k] * w[k * 2 + col])
                .sum::<f32>()
                .tanh();
            assert!((g - e).abs() < 1e-5, "run {run}: {got:?}");
        }
    }
}
