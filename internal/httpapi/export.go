package httpapi

import (
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// exportDocument renders the BindingProvider once: it only depends on the
// configuration. The poll method comes first; released CLIs skip it and
// take the OAuth2CodeGrant entry, which is left out when the callback
// flow is off (Config.NoCallbackFlow).
func exportDocument(cfg Config, prefix string) ([]byte, error) {
	at := func(path string) string {
		u := url.URL{Scheme: cfg.ExternalURL.Scheme, Host: cfg.ExternalURL.Host, Path: prefix + path}
		if cfg.ExternalURL.RawPath != "" {
			u.RawPath = prefix + path
			if p, err := url.PathUnescape(u.RawPath); err == nil {
				u.Path = p
			}
		}
		return u.String()
	}
	doc := v1alpha1.BindingProvider{
		APIVersion:         v1alpha1.ProviderAPIVersion,
		Kind:               v1alpha1.KindBindingProvider,
		ProviderPrettyName: cfg.PrettyName,
		Version:            ProtocolVersion,
		AuthenticationMethods: []v1alpha1.AuthenticationMethod{
			{
				Method: v1alpha1.MethodOAuth2CodeGrantPoll,
				OAuth2CodeGrantPoll: &v1alpha1.OAuth2CodeGrantPoll{
					SessionURL:       at(PathSessions),
					AuthenticatedURL: at(PathAuthorize),
					PollURL:          at(PathPoll),
					PollInterval:     cfg.PollInterval.String(),
				},
			},
			{
				Method:          v1alpha1.MethodOAuth2CodeGrant,
				OAuth2CodeGrant: &v1alpha1.OAuth2CodeGrant{AuthenticatedURL: at(PathAuthorize)},
			},
		},
	}
	if cfg.NoCallbackFlow {
		doc.AuthenticationMethods = doc.AuthenticationMethods[:1]
	}
	if d := cfg.LongPoll.MaxWait(); d > 0 {
		doc.AuthenticationMethods[0].OAuth2CodeGrantPoll.LongPollMaxWait = d.String()
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (s *server) serveExport(w http.ResponseWriter, _ *http.Request) {
	writeJSONBytes(w, http.StatusOK, s.export)
}
