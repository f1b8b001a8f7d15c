use heddle_kernel::Registry;
use heddle_kernel::bench::{Shape, run_shape};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_shapes_run_to_completion() {
    let reg = Registry::with_builtins();
    for (shape, n, m) in [
        (Shape::Chain, 10, 100),
        (Shape::Fanout, 100, 0),
        (Shape::Wide, 50, 0),
    ] {
        let r = run_shape(&reg, shape, n, m)
            .await
            .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        assert!(r.invocations > 0);
        // `heddle bench` reports CPU time next to wall time; Unix always has getrusage.
        #[cfg(unix)]
        assert!(r.cpu.is_some(), "{shape:?}: no CPU time reading");
    }
}
