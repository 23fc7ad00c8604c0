package federation

import (
	"strings"
	"testing"
)

// A member Secret's kubeconfig may not make the controller run a command or
// read its own files (issue 24, 7): an exec plugin, an auth provider and file
// references are refused; inline credentials are taken.
func TestMemberConfigRefusesCommandsAndFiles(t *testing.T) {
	const head = "apiVersion: v1\nkind: Config\ncurrent-context: m\ncontexts:\n- name: m\n  context: {cluster: m, user: u}\n"
	const cluster = "clusters:\n- name: m\n  cluster: {server: \"https://192.0.2.1:6443\", certificate-authority-data: \"\"}\n"
	for _, c := range []struct {
		name, kc, want string
	}{
		{"inline token", head + cluster + "users:\n- name: u\n  user: {token: abc}\n", ""},
		{"exec plugin", head + cluster + "users:\n- name: u\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, id], interactiveMode: Never}\n", `user "u" has an exec plugin`},
		{"auth provider", head + cluster + "users:\n- name: u\n  user:\n    auth-provider: {name: oidc, config: {cmd-path: /bin/sh}}\n", `user "u" has an auth provider`},
		{"token file", head + cluster + "users:\n- name: u\n  user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}\n", `user "u" has a token file`},
		{"client key file", head + cluster + "users:\n- name: u\n  user: {client-certificate: /etc/x.crt, client-key: /etc/x.key}\n", `user "u" has a client certificate file, user "u" has a client key file`},
		{"CA file", head + "clusters:\n- name: m\n  cluster: {server: \"https://192.0.2.1:6443\", certificate-authority: /etc/shadow}\n" + "users:\n- name: u\n  user: {token: abc}\n", `cluster "m" has a certificate authority file`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := memberConfig([]byte(c.kc))
			switch {
			case c.want == "" && (err != nil || cfg.BearerToken != "abc" || cfg.Host != "https://192.0.2.1:6443"):
				t.Errorf("config %+v, %v; want the inline one", cfg, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}
