// Templated kernels: one source, several instantiations, each a kernel of its own.

template <typename T>
__global__ void saxpy(T a, const T* x, T* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

struct Square {
  template <typename T>
  __device__ T operator()(T value) const { return value * value; }
};

struct Clamp {
  template <typename T>
  __device__ T operator()(T value) const { return value < T(0) ? T(0) : (value > T(100) ? T(100) : value); }
};

template <typename T, typename Op>
__global__ void transform(T* data, int n, Op op) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    data[i] = op(data[i]);
  }
}

template __global__ void saxpy<float>(float, const float*, float*, int);
template __global__ void saxpy<double>(double, const double*, double*, int);
template __global__ void saxpy<int>(int, const int*, int*, int);
template __global__ void transform<int, Square>(int*, int, Square);
template __global__ void transform<float, Clamp>(float*, int, Clamp);
