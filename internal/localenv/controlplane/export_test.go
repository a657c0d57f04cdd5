package controlplane

// Pids are the process ids of the servers, in start order, for the test
// that they die with their parent.
func Pids(cp *ControlPlane) []int {
	var pids []int
	for _, p := range cp.procs {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}
