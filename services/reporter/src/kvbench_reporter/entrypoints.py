"""What the `kvbench` CLI may use of the reporter without a server: the report's schema and the Grafana
dashboards. The CLI imports nothing else of this service (checked by `make lint`)."""

from kvbench_reporter.dashboards import export_dashboards, push_dashboards
from kvbench_reporter.schema import Report, report_json_schema

__all__ = ["Report", "export_dashboards", "push_dashboards", "report_json_schema"]
