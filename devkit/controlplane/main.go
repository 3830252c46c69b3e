// Command periscope-kube-apiserver is a test control plane: an embedded etcd and a real kube-apiserver
// (Kubernetes' own code, not a fake) in one process, on loopback, with certificates made at start.
//
// It exists so that Periscope's watcher, its API access control and the RBAC in deploy/ meet
// Kubernetes itself in tests and in `periscope up --apiserver kube`. It is development kit only.
//
//	periscope-kube-apiserver --dir DIR --token-file FILE [--runtime-config S] [--authorization-mode M]
//	                         [-- kube-apiserver flags...]
//
// When etcd is up and the apiserver's port is chosen it writes DIR/controlplane.json (server URL, CA
// file, etcd client URL), then runs the apiserver until SIGTERM/SIGINT. Readiness is the apiserver's
// own /readyz; the caller polls it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// announcement is what the caller reads from DIR/controlplane.json.
type announcement struct {
	Server string `json:"server"`
	CA     string `json:"ca"`
	Etcd   string `json:"etcd"`
	PID    int    `json:"pid"`
}

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("periscope-kube-apiserver", flag.ContinueOnError)
	dir := fs.String("dir", "", "state directory: certificates and etcd data (created)")
	tokenFile := fs.String("token-file", "", "static token file (token,user,uid,\"group,...\")")
	runtimeConfig := fs.String("runtime-config", "", "passed to kube-apiserver --runtime-config")
	port := fs.Int("port", 0, "secure port on 127.0.0.1 (0: a free one)")
	// Node authorization runs informers of its own (DRA ResourceSlices in resource.k8s.io/v1): a
	// control plane with v1 switched off, as a 1.32 or 1.33 cluster serves DRA, must leave it out.
	authz := fs.String("authorization-mode", "Node,RBAC", "passed to kube-apiserver --authorization-mode")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *dir == "" || *tokenFile == "" {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver: --dir and --token-file are required")
		return 2
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver:", err)
		return 2
	}
	pki, err := makePKI(filepath.Join(*dir, "pki"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver: certificates:", err)
		return 1
	}
	etcd, err := startEtcd(filepath.Join(*dir, "etcd"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver: etcd:", err)
		return 1
	}
	defer etcd.Close()

	securePort := *port
	if securePort == 0 {
		if securePort, err = freePort(); err != nil {
			fmt.Fprintln(os.Stderr, "periscope-kube-apiserver:", err)
			return 1
		}
	}
	args := apiserverArgs(pki, etcd.clientURL, *tokenFile, *runtimeConfig, *authz, securePort)
	args = append(args, fs.Args()...) // after "--": the caller's own kube-apiserver flags win
	line, _ := json.Marshal(announcement{
		Server: "https://127.0.0.1:" + strconv.Itoa(securePort),
		CA:     pki.caCert,
		Etcd:   etcd.clientURL,
		PID:    os.Getpid(),
	})
	// Written whole, then renamed: the caller never reads half of it.
	announced := filepath.Join(*dir, "controlplane.json")
	if err := os.WriteFile(announced+".tmp", line, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver:", err)
		return 1
	}
	if err := os.Rename(announced+".tmp", announced); err != nil {
		fmt.Fprintln(os.Stderr, "periscope-kube-apiserver:", err)
		return 1
	}

	command := app.NewAPIServerCommand()
	command.SetArgs(args)
	return cli.Run(command)
}

// apiserverArgs are the flags of a small single-node control plane: loopback only, static tokens for
// test users, RBAC and Node authorization as on a real cluster.
func apiserverArgs(p pkiFiles, etcdURL, tokenFile, runtimeConfig, authz string, port int) []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=" + etcdURL,
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=" + authz,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPublic,
		"--service-account-signing-key-file=" + p.saPrivate,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		// No controller-manager runs, so nothing creates each namespace's "default" ServiceAccount;
		// the admission plugin that requires it would reject every pod.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type=none",
		"--v=0",
	}
	if strings.TrimSpace(runtimeConfig) != "" {
		args = append(args, "--runtime-config="+runtimeConfig)
	}
	return args
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
