

def test_join_needs_the_first_launcher_running(tmp_path: Path) -> None:
    run_path = tmp_path / "r1"
    job = elastic.ElasticJob(endpoint="127.0.0.1:4321", rdzv_id="r1", nnodes="1:3", nproc_per_node=1, max_restarts=3,
                             shutdown_timeout_s=60, rdzv_conf={}, module="trainers.train", trainer_args=[])
    elastic.write_job(elastic.job_dir(run_path), job)
    assert elastic.read_job(run_path) == job
    elastic.write_launcher(elastic.job_dir(run_path), elastic.Launcher(0, pid=2**22 + 9, addr="127.0.0.1"))
    with pytest.raises(elastic.ElasticError, match="first launcher .* is not running"):
        elastic.join(run_path)
    assert [la.index for la in elastic.launchers(run_path)] == [0]  # nothing was started or reserved
