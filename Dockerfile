# The pgwake container image: the static binary on an empty base (nothing
# to pull: scratch needs no registry), run as an unprivileged user.
# goreleaser builds it for linux/amd64 and linux/arm64 (goreleaser.yaml,
# dockers_v2), with each binary at $TARGETPLATFORM/pgwake in the context.
# By hand (as .ci/run and TestIntegrationContainerImage do):
#   mkdir -p ctx/linux/amd64 && CGO_ENABLED=0 go build -trimpath -o ctx/linux/amd64/pgwake ./cmd/pgwake
#   docker build --build-arg TARGETPLATFORM=linux/amd64 -f Dockerfile ctx
FROM scratch
ARG TARGETPLATFORM
COPY $TARGETPLATFORM/pgwake /usr/local/bin/pgwake
# In a pod the kubernetes backend keeps nothing on disk; this directory
# is an in-memory emptyDir in deploy/kubernetes.
ENV PGWAKE_STATE_DIR=/run/pgwake
USER 65532:65532
EXPOSE 5432 9632
ENTRYPOINT ["/usr/local/bin/pgwake"]
CMD ["up", "--backend=kubernetes", "--listen=0.0.0.0:5432"]
