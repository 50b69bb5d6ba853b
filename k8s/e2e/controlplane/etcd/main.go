// etcd at the version kube-apiserver v1.36.3 is built and tested against (its go.mod:
// go.etcd.io/etcd/server/v3 v3.6.8). Debian 12's etcd-server is 3.4.23, older than the
// 3.4.31 the API server needs for watch progress requests: with it, every client-go watch
// list ends in an error and kwok sees pod changes only when it lists again.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
