package main

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

type etcdServer struct {
	e         *embed.Etcd
	clientURL string
}

func (s *etcdServer) Close() { s.e.Close() }

// startEtcd runs a single-member etcd in this process. Its client URL also serves etcd's JSON
// gateway (/v3/kv/...), which tests use to force a compaction.
func startEtcd(dataDir string) (*etcdServer, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	client, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))

	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.Name = "periscope"
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// A throwaway test store: durability buys nothing and fsync costs seconds on a busy disk.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("not ready after 60s")
	}
	return &etcdServer{e: e, clientURL: client.String()}, nil
}
