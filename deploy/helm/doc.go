// Package helm holds the tests of the Helm chart in shardproxy/ (deploy/helm/shardproxy):
// rendered offline with Helm's own Go packages, the chart must produce the same objects
// as the kustomize overlays of deploy/ for the same settings, so that the two ways to
// install cannot drift apart.
package helm
