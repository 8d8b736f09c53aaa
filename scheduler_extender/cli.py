"""`vcuda extender` flags and wiring. Precedence: flag > environment > default."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from kube_contract.names import DEFAULT_ANNOTATION_PREFIX, DEFAULT_RESOURCE_DOMAIN, Names

from .placement import Policy

log = logging.getLogger("scheduler_extender")


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=_env("VCUDA_EXTENDER_LISTEN", ":8888"),
                        metavar="ADDR",
                        help="HTTP address, e.g. :8888 or 127.0.0.1:8888 "
                             "(env VCUDA_EXTENDER_LISTEN; default %(default)s)")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None,
                        help="kubeconfig file (env KUBECONFIG); default: in-cluster "
                             "service account, else ~/.kube/config")
    parser.add_argument("--context", default=None, help="kubeconfig context")
    parser.add_argument("--resource-domain",
                        default=_env("VCUDA_RESOURCE_DOMAIN", DEFAULT_RESOURCE_DOMAIN),
                        help="domain of the vcuda-core / vcuda-memory resources "
                             "(env VCUDA_RESOURCE_DOMAIN; default %(default)s)")
    parser.add_argument("--annotation-prefix",
                        default=_env("VCUDA_ANNOTATION_PREFIX", DEFAULT_ANNOTATION_PREFIX),
                        help="prefix of vcuda annotations (env VCUDA_ANNOTATION_PREFIX; "
                             "default %(default)s)")
    parser.add_argument("--default-policy", choices=[p.value for p in Policy],
                        default=_env("VCUDA_DEFAULT_POLICY", Policy.BINPACK.value),
                        help="policy for pods without a scheduling-policy annotation "
                             "(env VCUDA_DEFAULT_POLICY; default %(default)s)")
    parser.add_argument("--reservation-ttl", type=float, default=300.0, metavar="SECONDS",
                        help="forget a bind decision the API server never confirms after "
                             "this long (default %(default)s)")
    parser.add_argument("--watch-timeout", type=int, default=240, metavar="SECONDS",
                        help="restart each watch after this long (default %(default)s)")
    parser.add_argument("--log-level", default=_env("VCUDA_LOG_LEVEL", "info"),
                        choices=["error", "warn", "info", "debug"])
    hook = parser.add_argument_group(
        "admission webhook", "a mutating webhook that sends pods asking for vcuda resources to --scheduler-name; "
        "served on its own HTTPS port when --webhook-listen is given (README: 'Admission webhook')")
    hook.add_argument("--webhook-listen", default=None, metavar="ADDR",
                      help="HTTPS address of the webhook, e.g. :9443; POST /mutate-pods (default: no webhook)")
    hook.add_argument("--webhook-service", default=None, metavar="SVC.NAMESPACE",
                      help="the Service the API server calls the webhook through; the serving certificate "
                           "names SVC, SVC.NAMESPACE, SVC.NAMESPACE.svc and SVC.NAMESPACE.svc.cluster.local")
    hook.add_argument("--webhook-tls-secret", default=None, metavar="NAMESPACE/NAME",
                      help="Secret holding the webhook's CA and serving certificate (ca.crt, ca.key, tls.crt, "
                           "tls.key); created if absent, reused while valid, rotated before expiry")
    hook.add_argument("--webhook-cert-dir", default=None, metavar="DIR",
                      help="keep the same files in DIR instead of a Secret (outside Kubernetes)")
    hook.add_argument("--webhook-configuration", default=None, metavar="NAME",
                      help="MutatingWebhookConfiguration whose webhooks get the CA bundle as caBundle "
                           "(checked every minute, re-set when it differs)")
    hook.add_argument("--scheduler-name", default=_env("VCUDA_SCHEDULER_NAME", "vcuda-scheduler"),
                      help="schedulerName the webhook sets (env VCUDA_SCHEDULER_NAME; default %(default)s)")
    hook.add_argument("--webhook-resources", default=None, metavar="LIST",
                      help="comma list of resources that send a pod to --scheduler-name (default: "
                           "DOMAIN/vcuda-core,DOMAIN/vcuda-memory with DOMAIN from --resource-domain); "
                           "add nvidia.com/gpu, nvidia.com/mps-core for the pgpu and mps modes")


def run(args: argparse.Namespace) -> int:
    from kube_contract.apiclient import make_api_client

    from .extender import Extender
    from .kube import KubeBinder, Syncer
    from .server import ExtenderServer, parse_listen, tune_gc
    from .state import ClusterState

    level = {"warn": logging.WARNING}.get(args.log_level, args.log_level.upper())
    logging.basicConfig(level=level, format="vcuda-extender %(levelname)s %(name)s: %(message)s")
    try:
        names = Names(args.resource_domain, args.annotation_prefix)
        address = parse_listen(args.listen)
        if args.reservation_ttl <= 0 or args.watch_timeout <= 0:
            raise ValueError("--reservation-ttl and --watch-timeout must be > 0")
        hook = None
        if args.webhook_listen:
            from .webhook.app import settings
            hook = settings(args, names, parse_listen(args.webhook_listen, "--webhook-listen"))
    except ValueError as e:
        print(f"vcuda extender: {e}", file=sys.stderr)
        return 2
    try:
        from kubernetes import client
        api_client = make_api_client(args.kubeconfig, args.context)
        api = client.CoreV1Api(api_client)
    except Exception as e:  # no cluster credentials at all
        print(f"vcuda extender: cannot reach Kubernetes: {e}", file=sys.stderr)
        return 1
    state = ClusterState(names, reservation_ttl=args.reservation_ttl)
    syncer = Syncer(api, state, watch_timeout=args.watch_timeout)
    extender = Extender(state, KubeBinder(api), default_policy=Policy(args.default_policy))
    server = ExtenderServer(address, extender, ready=syncer.ready)

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    # Before anything serves: a SIGTERM that comes as soon as the webhook answers must stop us cleanly.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    webhook = None
    if hook is not None:
        from .webhook.app import Webhook
        from .webhook.stores import StoreError
        try:
            webhook = Webhook(hook, api_client)
            webhook.start()
        except (OSError, StoreError) as e:
            print(f"vcuda extender: webhook: {e}", file=sys.stderr)
            server.server_close()
            return 1
        log.info("webhook serving on https://%s:%d/mutate-pods (%s -> schedulerName %s)",
                 *webhook.server.server_address[:2], ",".join(sorted(hook.rules.resources)),
                 hook.rules.scheduler_name)
    syncer.start()
    # Once the first lists are in, take the node map out of the collector's scans.
    threading.Thread(target=lambda: syncer.wait_ready(600) and tune_gc(), daemon=True).start()
    log.info("serving on %s:%d (resources %s, %s; default policy %s)", *server.server_address[:2],
             names.core_resource, names.memory_resource, args.default_policy)
    try:
        server.serve_forever()
    finally:
        syncer.stop()
        server.server_close()
        if webhook is not None:
            webhook.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vcuda extender",
                                     description="kube-scheduler extender for vcuda GPU shares")
    add_arguments(parser)
    return run(parser.parse_args(argv))
